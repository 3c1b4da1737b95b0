"""The Skyhook controller on the whole local stack: the simulator's API, Job controller and
kubelet, real NATS, k8s-watcher, and maintenance-scheduler's Skyhook controller."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from k8s_watcher.kinds import CREATABLE_KINDS, DELETABLE_KINDS
from maintenance_scheduler.config import MaintenanceSchedulerConfig
from maintenance_scheduler.skyhook.api import (
    erroring_condition,
    node_state_annotation,
    not_ready_condition,
    status_key,
)
from maintenance_scheduler.skyhook.jobs import maintenance_name
from maintenance_scheduler.skyhook.service import SkyhookController
from nodeflow_bus import Bus
from nodeflow_contracts import k8s
from nodeflow_contracts.k8s import K8sCommand
from nodeflow_contracts.maintenance import SkyhookDecision
from nodeflow_runtime.natsd import NatsServerProcess
from tests.integration.maintenance_scheduler.conftest import (
    CLUSTER,
    FAST_BUS,
    NODE_MAINTENANCES,
    NS,
    Stack,
    condition,
    eventually,
    run_stack,
)

SKYHOOKS = "skyhooks.skyhook.nvidia.com"
POLICIES = "deploymentpolicies.skyhook.nvidia.com"
API_VERSION = "skyhook.nvidia.com/v1alpha1"


class SkyhookStack:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.controller: SkyhookController | None = None
        self.buses: list[Bus] = []
        self.decisions: list[SkyhookDecision] = []
        self.generation = 0

    async def start(self, **overrides: Any) -> SkyhookController:
        self.generation += 1
        settings: dict[str, Any] = {
            "nats_url": (self.stack.nats_url,),
            "instance_id": f"sky-{self.generation}",
            "leader_lease_ttl_seconds": 1.5,
            "resync_seconds": 0.5,
            "debounce_seconds": 0.02,
            "in_flight_timeout_seconds": 5.0,
            "skyhook_namespace": NS,
            **overrides,
        }
        bus = await Bus.connect(self.stack.nats_url, options=FAST_BUS)
        self.buses.append(bus)
        controller = SkyhookController(bus, MaintenanceSchedulerConfig(**settings))
        await controller.start()
        await controller.lease.wait_until_leader(timeout=10)
        self.controller = controller
        return controller

    async def kill(self) -> None:
        controller, self.controller = self.controller, None
        assert controller is not None
        task = controller._leader_loop.task
        if task is not None:
            task.cancel()
        await controller.lease.stop(release=False)
        await self.buses.pop().nc.close()

    async def stop(self) -> None:
        if self.controller is not None:
            await self.controller.stop()
            self.controller = None
        while self.buses:
            await self.buses.pop().close()

    # --- objects -----------------------------------------------------------------------------

    def policy(self, name: str, strategy: dict[str, Any]) -> None:
        self.stack.sim.store.create(
            POLICIES,
            {
                "apiVersion": API_VERSION,
                "kind": "DeploymentPolicy",
                "metadata": {"name": name},
                "spec": {"default": {"budget": {"percent": 100}, "strategy": strategy}},
            },
        )

    def skyhook(self, name: str, packages: dict[str, Any], **spec: Any) -> None:
        self.stack.sim.store.create(
            SKYHOOKS,
            {
                "apiVersion": API_VERSION,
                "kind": "Skyhook",
                "metadata": {"name": name},
                "spec": {"packages": packages, **spec},
            },
        )

    def get(self, name: str) -> dict[str, Any]:
        return self.stack.sim.store.get(SKYHOOKS, name)

    def status(self, name: str) -> str:
        return str((self.get(name).get("status") or {}).get("status") or "")

    def jobs(self, skyhook: str) -> list[dict[str, Any]]:
        selector = f"skyhook.nvidia.com/name={skyhook}"
        return list(self.stack.sim.store.list("jobs.batch", NS, label_selector=selector).items)


@pytest.fixture
async def sky(nats_server: NatsServerProcess) -> AsyncIterator[SkyhookStack]:
    async with run_stack(nats_server.url) as stack:
        running = SkyhookStack(stack)

        async def on_decision(msg: Any) -> None:
            running.decisions.append(msgspec.json.decode(msg.data, type=SkyhookDecision))

        subscription = await stack.bus.nc.subscribe(
            "maintenance.v1.skyhook.*.decision", cb=on_decision
        )
        try:
            yield running
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
            await running.stop()


TWO_PACKAGES = {
    "driver": {"version": "1.0.0", "image": "registry.local/driver"},
    "tuning": {
        "version": "2.0.0",
        "image": "registry.local/tuning",
        "dependsOn": {"driver": "1.0.0"},
    },
}


def condition_true(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for entry in (job.get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind and entry.get("status") == "True":
            return dict(entry)
    return None


async def test_two_package_skyhook_reaches_complete_with_one_job_per_stage_and_node(
    sky: SkyhookStack,
) -> None:
    await sky.start()
    sky.policy("exp", {"exponential": {"initialBatch": 1, "growthFactor": 2}})
    sky.skyhook("gpu-init", TWO_PACKAGES, deploymentPolicy="exp")
    await eventually(
        lambda: sky.status("gpu-init") == "complete", timeout=60, what="Skyhook complete"
    )
    nodes = sky.stack.node_names()
    jobs = sky.jobs("gpu-init")
    per_stage = Counter(
        (
            j["metadata"]["labels"]["skyhook.nvidia.com/package"],
            j["metadata"]["labels"]["skyhook.nvidia.com/stage"],
            j["metadata"]["labels"]["skyhook.nvidia.com/node"],
        )
        for j in jobs
    )
    assert len(per_stage) == 2 * 2 * len(nodes)
    assert set(per_stage.values()) == {1}
    assert all(condition_true(j, "Complete") for j in jobs)
    job = jobs[0]
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["ttlSecondsAfterFinished"] == 86400
    assert job["spec"]["podReplacementPolicy"] == "Failed"
    assert job["metadata"]["ownerReferences"][0]["kind"] == "Skyhook"
    status = sky.get("gpu-init")["status"]
    assert status["completeNodes"] == f"{len(nodes)}/{len(nodes)}"
    node = sky.stack.node(nodes[0])
    assert node["metadata"]["labels"][status_key("gpu-init")] == "complete"
    state = node["metadata"]["annotations"][node_state_annotation("gpu-init")]
    assert '"state":"complete"' in state
    # The rollout went one node first, then two, then the rest.
    started = [
        d.node
        for d in sky.decisions
        if d.kind == "stage" and d.reason == "started" and d.package == "driver"
    ]
    assert sorted(started) == nodes


async def test_unpullable_image_goes_erroring_within_the_grace_naming_the_image(
    sky: SkyhookStack,
) -> None:
    await sky.start(skyhook_image_pull_grace_seconds=1.0)
    packages = {"driver": {"version": "1.0.0-unpullable", "image": "registry.local/missing"}}
    one_node = {"matchLabels": {"kubernetes.io/hostname": sky.stack.node_names()[0]}}
    sky.skyhook("broken", packages, interruptionBudget={"count": 1}, nodeSelectors=one_node)
    await eventually(lambda: sky.status("broken") == "erroring", timeout=30, what="erroring")
    (job,) = sky.jobs("broken")

    def job_failed() -> dict[str, Any] | None:
        (current,) = sky.jobs("broken")
        return condition_true(current, "Failed")

    failed = await eventually(job_failed, timeout=20, what="Job Failed")
    assert failed["reason"] == "DeadlineExceeded"
    node = job["metadata"]["labels"]["skyhook.nvidia.com/node"]
    state = sky.stack.node(node)["metadata"]["annotations"][node_state_annotation("broken")]
    assert "registry.local/missing:1.0.0-unpullable could not be pulled" in state
    await eventually(
        lambda: any(d.kind == "fail-job" for d in sky.decisions), timeout=10, what="decision"
    )
    # Nothing retries by itself: one Job, kept for its logs (no TTL deletes a failed one).
    await eventually(
        lambda: "ttlSecondsAfterFinished" not in sky.jobs("broken")[0]["spec"],
        timeout=10,
        what="failed Job kept",
    )
    assert len(sky.jobs("broken")) == 1


async def test_controller_killed_mid_rollout_resumes_with_no_duplicate_job(
    sky: SkyhookStack,
) -> None:
    await sky.start()
    sky.policy("lin", {"linear": {"initialBatch": 1, "delta": 1}})
    sky.skyhook("resume", TWO_PACKAGES, deploymentPolicy="lin")
    await eventually(lambda: len(sky.jobs("resume")) >= 3, timeout=30, what="some Jobs")
    await sky.kill()
    await sky.start()
    await eventually(lambda: sky.status("resume") == "complete", timeout=60, what="complete")
    creates = Counter(
        o.target.name
        for o in sky.stack.outcomes
        if o.op == "create" and o.target.kind == "Job" and o.outcome == "applied"
    )
    assert set(creates.values()) == {1}
    assert len(sky.jobs("resume")) == 2 * 2 * len(sky.stack.node_names())


async def rounds_pass(sky: SkyhookStack, count: int) -> None:
    """Wait until the controller has made `count` more rounds (on the resync at the latest)."""
    controller = sky.controller
    assert controller is not None
    target = controller.rounds + count
    await eventually(lambda: controller.rounds >= target, timeout=30, what=f"{count} rounds")


async def test_failed_batches_stop_the_rollout_after_failure_threshold(sky: SkyhookStack) -> None:
    await sky.start()
    sky.policy(
        "strict", {"exponential": {"initialBatch": 1, "growthFactor": 2, "failureThreshold": 1}}
    )
    packages = {"driver": {"version": "1.0.0-fail", "image": "registry.local/driver"}}
    sky.skyhook("stopper", packages, deploymentPolicy="strict")

    def stopped() -> bool:
        status = sky.get("stopper").get("status") or {}
        batch = (status.get("compartmentStatuses") or {}).get("__default__", {})
        return bool((batch.get("batchState") or {}).get("shouldStop"))

    await eventually(stopped, timeout=30, what="shouldStop")
    status = sky.get("stopper")["status"]
    # Erroring beside waiting nodes: unknown, as upstream's CollectNodeStatus.
    assert status["status"] == "unknown"
    assert any(c["type"] == "RolloutStopped" for c in status["conditions"])
    await rounds_pass(sky, 3)
    (job,) = sky.jobs("stopper")  # nothing started after the failed batch
    node = job["metadata"]["labels"]["skyhook.nvidia.com/node"]
    state = sky.stack.node(node)["metadata"]["annotations"][node_state_annotation("stopper")]
    assert "BackoffLimitExceeded" in state
    waiting = [n for n, s in status["nodeStatus"].items() if s == "waiting"]
    assert len(waiting) == len(sky.stack.node_names()) - 1


async def test_unpullable_image_errors_within_the_grace_and_stops_after_failure_threshold(
    sky16: SkyhookStack,
) -> None:
    # Sixteen nodes: two failed one-node batches leave the progress (2/16) below the
    # safetyLimit (50%), so failureThreshold 2 stops the rollout.
    sky = sky16
    await sky.start(skyhook_image_pull_grace_seconds=1.0)
    sky.policy(
        "strict", {"exponential": {"initialBatch": 1, "growthFactor": 2, "failureThreshold": 2}}
    )
    packages = {"driver": {"version": "1.0.0-unpullable", "image": "registry.local/missing"}}
    sky.skyhook("unpulled", packages, deploymentPolicy="strict")

    def stopped() -> bool:
        status = sky.get("unpulled").get("status") or {}
        batch = (status.get("compartmentStatuses") or {}).get("__default__", {})
        return bool((batch.get("batchState") or {}).get("shouldStop"))

    await eventually(stopped, timeout=60, what="shouldStop")
    status = sky.get("unpulled")["status"]
    assert status["status"] == "unknown"
    batch = status["compartmentStatuses"]["__default__"]["batchState"]
    assert batch["consecutiveFailures"] == 2
    await rounds_pass(sky, 3)
    # Two batches of one node (the second shrunk by the growth factor, floor 1), then nothing.
    jobs = sky.jobs("unpulled")
    assert len(jobs) == 2
    for job in jobs:
        failed = condition_true(job, "Failed")
        assert failed is not None and failed["reason"] == "DeadlineExceeded"
        assert job["status"].get("succeeded", 0) == 0  # a pod that never ran did not succeed
        node = job["metadata"]["labels"]["skyhook.nvidia.com/node"]
        state = sky.stack.node(node)["metadata"]["annotations"][node_state_annotation("unpulled")]
        assert "registry.local/missing:1.0.0-unpullable could not be pulled" in state
    waiting = [n for n, s in status["nodeStatus"].items() if s == "waiting"]
    assert len(waiting) == len(sky.stack.node_names()) - 2


async def test_an_oom_stage_says_oomkilled(sky: SkyhookStack) -> None:
    await sky.start()
    one_node = {"matchLabels": {"kubernetes.io/hostname": sky.stack.node_names()[0]}}
    packages = {"hungry": {"version": "1.0.0-oom", "image": "registry.local/hungry"}}
    sky.skyhook("oom", packages, nodeSelectors=one_node)
    await eventually(lambda: sky.status("oom") == "erroring", timeout=30, what="erroring")
    node = sky.stack.node_names()[0]

    def node_state() -> str:
        annotations = sky.stack.node(node)["metadata"]["annotations"]
        return str(annotations[node_state_annotation("oom")])

    # The Job's Failed condition can be mirrored a moment before its OOM-killed pod: the
    # message follows the pod.
    await eventually(lambda: "OOMKilled" in node_state(), timeout=30, what="OOMKilled")


async def test_pause_starts_no_new_stage_and_resume_finishes(sky: SkyhookStack) -> None:
    await sky.start()
    sky.skyhook("pausable", TWO_PACKAGES, interruptionBudget={"count": 1})
    await eventually(lambda: sky.jobs("pausable"), timeout=30, what="a first Job")
    sky.stack.sim.store.patch(
        SKYHOOKS,
        "pausable",
        {"metadata": {"annotations": {"skyhook.nvidia.com/pause": "true"}}},
        "application/merge-patch+json",
    )
    await eventually(lambda: sky.status("pausable") == "paused", timeout=30, what="paused")

    def all_finished() -> bool:
        return all(
            condition_true(j, "Complete") or condition_true(j, "Failed")
            for j in sky.jobs("pausable")
        )

    await eventually(all_finished, timeout=30, what="running stages finished")
    before = len(sky.jobs("pausable"))
    await rounds_pass(sky, 3)
    assert len(sky.jobs("pausable")) == before
    sky.stack.sim.store.patch(
        SKYHOOKS,
        "pausable",
        {"metadata": {"annotations": {"skyhook.nvidia.com/pause": None}}},
        "application/merge-patch+json",
    )
    await eventually(lambda: sky.status("pausable") == "complete", timeout=90, what="complete")
    assert len(sky.jobs("pausable")) == 2 * 2 * len(sky.stack.node_names())


@contextlib.asynccontextmanager
async def node_maintenance_writes(sky: SkyhookStack) -> AsyncIterator[None]:
    """k8s-watcher does not yet create or delete NodeMaintenance objects for anyone (its
    CREATABLE_KINDS/DELETABLE_KINDS), so these commands come back `forbidden`. Until it does,
    this plays that one part for the test, applying exactly the commands the controller sent;
    once k8s-watcher allows them it does nothing."""
    if "NodeMaintenance" in CREATABLE_KINDS and "NodeMaintenance" in DELETABLE_KINDS:
        yield
        return
    store = sky.stack.sim.store

    async def on_command(msg: Any) -> None:
        command = msgspec.json.decode(msg.data, type=K8sCommand)
        if command.target.kind != "NodeMaintenance":
            return
        with contextlib.suppress(Exception):
            if isinstance(command.operation, k8s.CreateObject):
                store.create(NODE_MAINTENANCES, dict(command.operation.object))
            elif isinstance(command.operation, k8s.DeleteObject):
                store.delete(NODE_MAINTENANCES, command.target.name, namespace=NS)

    subscription = await sky.stack.bus.nc.subscribe("cmd.k8s.v1.>", cb=on_command)
    try:
        yield
    finally:
        await subscription.unsubscribe()


async def test_interrupt_runs_only_once_its_node_maintenance_is_ready_then_releases_it(
    sky: SkyhookStack,
) -> None:
    stack = sky.stack
    node = stack.node_names()[0]
    stack.run_pod("training", node, labels={"app": "training"})
    await eventually(
        lambda: (stack.pod("training") or {}).get("status", {}).get("phase") == "Running"
    )
    await stack.start_scheduler()
    await sky.start()
    packages = {
        "kernel": {
            "version": "1.0.0",
            "image": "registry.local/kernel",
            "interrupt": {"type": "reboot"},
        }
    }
    async with node_maintenance_writes(sky):
        sky.skyhook(
            "rebooter",
            packages,
            nodeSelectors={"matchLabels": {"kubernetes.io/hostname": node}},
            podNonInterruptLabels={"matchLabels": {"app": "training"}},
        )
        request = maintenance_name("rebooter", node)
        await eventually(
            lambda: stack.phase(request) == "WaitForPodCompletion", timeout=30, what="waiting"
        )
        assert stack.unschedulable(node)  # cordoned through the maintenance request
        await rounds_pass(sky, 3)
        stages = {j["metadata"]["labels"]["skyhook.nvidia.com/stage"] for j in sky.jobs("rebooter")}
        assert "interrupt" not in stages  # the training pod still runs: no interrupt yet
        assert not stages  # drained before apply (as upstream): not even apply runs yet
        stack.sim.store.delete("pods", "training", namespace=NS)
        await eventually(lambda: sky.status("rebooter") == "complete", timeout=60, what="complete")
        stages = {j["metadata"]["labels"]["skyhook.nvidia.com/stage"] for j in sky.jobs("rebooter")}
        assert stages == {"apply", "config", "interrupt", "post-interrupt"}
        await eventually(lambda: stack.get_request(request) is None, timeout=30, what="released")
        await eventually(lambda: not stack.unschedulable(node), timeout=30, what="uncordoned")


SLURM_LABELS = {"nodeflow.dev/nodeset": "compute", "nodeflow.dev/slurm-cluster": CLUSTER}


def pod_condition(stack: Stack, pod: str, kind: str) -> bool:
    found = condition(stack.pod(pod) or {}, kind)
    return found is not None and found.get("status") == "True"


STAGE = "skyhook.nvidia.com/stage"


def boot_id(stack: Stack, node: str) -> str:
    return str(stack.sim.store.get("nodes", node)["status"]["nodeInfo"]["bootID"])


async def test_reboot_interrupt_on_a_node_running_a_slurm_job_waits_for_the_job(
    sky: SkyhookStack,
) -> None:
    stack = sky.stack
    node = stack.node_names()[0]
    stack.run_pod("slurm-a", node, labels=SLURM_LABELS, cpu="1")
    await eventually(lambda: pod_condition(stack, "slurm-a", "SlurmNodeStateIdle"), what="idle")
    job = stack.run_job("slurm-a")
    await eventually(
        lambda: (
            pod_condition(stack, "slurm-a", "SlurmNodeStateAllocated")
            or pod_condition(stack, "slurm-a", "SlurmNodeStateMixed")
        ),
        what="a Slurm job runs on the node",
    )
    boot_before = boot_id(stack, node)
    await stack.start_scheduler()
    await sky.start()
    packages = {
        "firmware": {
            "version": "3.0.0",
            "image": "registry.local/fw",
            "interrupt": {"type": "reboot"},
        }
    }
    async with node_maintenance_writes(sky):
        sky.skyhook("fw", packages, nodeSelectors={"matchLabels": {"kubernetes.io/hostname": node}})
        request = maintenance_name("fw", node)
        await eventually(lambda: stack.phase(request) == "Draining", timeout=30, what="Draining")
        # Slurm drains the node first; the NodeSet pod stays while the job runs.
        await eventually(
            lambda: any(d.kind == "waiting-for-slurm" for d in stack.decisions),
            timeout=30,
            what="waiting for Slurm",
        )
        await rounds_pass(sky, 3)
        stages = {j["metadata"]["labels"]["skyhook.nvidia.com/stage"] for j in sky.jobs("fw")}
        assert "interrupt" not in stages
        assert stack.pod("slurm-a") is not None
        stack.cancel_job(job)
        await eventually(lambda: sky.status("fw") == "complete", timeout=60, what="complete")
        assert stack.pod("slurm-a") is None  # evicted only after Slurm let it go
        assert boot_id(stack, node) != boot_before  # the interrupt rebooted the node
        post = [j for j in sky.jobs("fw") if j["metadata"]["labels"][STAGE] == "post-interrupt"]
        assert len(post) == 1 and condition_true(post[0], "Complete")
        await eventually(lambda: stack.get_request(request) is None, timeout=30, what="released")


@pytest.fixture
async def sky16(nats_server: NatsServerProcess) -> AsyncIterator[SkyhookStack]:
    async with run_stack(nats_server.url, nodes=16) as stack:
        running = SkyhookStack(stack)
        try:
            yield running
        finally:
            await running.stop()


async def test_sixteen_nodes_exponential_policy_batches_1_2_4_then_the_rest(
    sky16: SkyhookStack,
) -> None:
    sky = sky16
    await sky.start()
    sky.policy("exp", {"exponential": {"initialBatch": 1, "growthFactor": 2}})
    sky.skyhook("wide", TWO_PACKAGES, deploymentPolicy="exp")
    batches: list[tuple[int, int]] = []

    def track() -> bool:
        status = sky.get("wide").get("status") or {}
        batch = ((status.get("compartmentStatuses") or {}).get("__default__") or {}).get(
            "batchState"
        ) or {}
        seen = (int(batch.get("currentBatch") or 0), int(batch.get("lastBatchSize") or 0))
        if seen[1] and (not batches or batches[-1] != seen):
            batches.append(seen)
        return status.get("status") == "complete"

    await eventually(track, timeout=120, interval=0.02, what="complete")
    jobs = sky.jobs("wide")
    assert len(jobs) == 2 * 2 * 16
    assert len({j["metadata"]["name"] for j in jobs}) == len(jobs)
    assert all(condition_true(j, "Complete") for j in jobs)
    sizes = [size for _, size in batches]
    assert sizes[:3] == [1, 2, 4]


async def test_deleting_a_skyhook_removes_its_node_marks_and_cordon_before_its_finalizer(
    sky: SkyhookStack,
) -> None:
    stack = sky.stack
    node = stack.node_names()[0]
    stack.run_pod("training", node, labels={"app": "training"})
    await eventually(
        lambda: (stack.pod("training") or {}).get("status", {}).get("phase") == "Running"
    )
    await stack.start_scheduler()
    await sky.start()
    packages = {
        "kernel": {
            "version": "1.0.0",
            "image": "registry.local/kernel",
            "interrupt": {"type": "reboot"},
        }
    }
    async with node_maintenance_writes(sky):
        sky.skyhook(
            "doomed",
            packages,
            nodeSelectors={"matchLabels": {"kubernetes.io/hostname": node}},
            podNonInterruptLabels={"matchLabels": {"app": "training"}},
        )
        request = maintenance_name("doomed", node)
        # Mid-rollout: the interrupt waits for the training pod, the node cordoned for it.
        await eventually(
            lambda: stack.phase(request) == "WaitForPodCompletion", timeout=30, what="waiting"
        )
        assert "skyhook.nvidia.com/skyhook" in sky.get("doomed")["metadata"]["finalizers"]
        labels = stack.node(node)["metadata"]["labels"]
        assert labels[status_key("doomed")] == "in_progress"
        assert stack.unschedulable(node)
        # Drained before apply (as upstream): no stage of the rebooting package runs yet.
        assert not sky.jobs("doomed")
        stack.sim.store.delete(SKYHOOKS, "doomed")

        def gone() -> bool:
            try:
                sky.get("doomed")
            except Exception:
                return True
            return False

        def marks_left() -> list[str]:
            meta = stack.node(node)["metadata"]
            keys = [*(meta.get("annotations") or {}), *(meta.get("labels") or {})]
            return [k for k in keys if k.endswith("_doomed")]

        await eventually(gone, timeout=60, what="the Skyhook finalized")
        assert marks_left() == []  # cleaned before the finalizer went
        assert stack.get_request(request) is None
        assert not stack.unschedulable(node)  # its cordon undone
        await eventually(lambda: not sky.jobs("doomed"), timeout=30, what="Jobs collected")


async def test_rule_skyhook_node_conditions_not_ready_and_erroring_through_k8s_watcher(
    sky: SkyhookStack,
) -> None:
    """`skyhook.nvidia.com/<name>/NotReady` and `/Erroring` on the Node's status, written by a
    strategic merge through k8s-watcher: False/Complete once the Skyhook is complete there,
    True/Erroring while a package fails; unchanged, not written again; gone with the deleted
    Skyhook; the kubelet's own conditions stay throughout."""
    await sky.start()
    good_node, bad_node = sky.stack.node_names()[:2]
    sky.skyhook(
        "good",
        {"driver": {"version": "1.0.0", "image": "registry.local/driver"}},
        nodeSelectors={"matchLabels": {"kubernetes.io/hostname": good_node}},
    )
    sky.skyhook(
        "bad",
        {"driver": {"version": "1.0.0-fail", "image": "registry.local/driver"}},
        nodeSelectors={"matchLabels": {"kubernetes.io/hostname": bad_node}},
    )

    def shown(node: str) -> dict[str, tuple[str, str]]:
        conditions = (sky.stack.node(node).get("status") or {}).get("conditions") or []
        return {c["type"]: (c["status"], c.get("reason", "")) for c in conditions}

    good = {
        not_ready_condition("good"): ("False", "Complete"),
        erroring_condition("good"): ("False", "Not Erroring"),
    }
    bad = {
        not_ready_condition("bad"): ("True", "Incomplete"),
        erroring_condition("bad"): ("True", "Package(s) Erroring or Unknown"),
    }
    await eventually(
        lambda: good.items() <= shown(good_node).items(), timeout=60, what="good complete"
    )
    await eventually(lambda: bad.items() <= shown(bad_node).items(), timeout=60, what="erroring")
    for node in (good_node, bad_node):
        assert shown(node)["Ready"] == ("True", "KubeletReady")
    # Nothing changes: later rounds write nothing on the node's status.
    written = sky.stack.node(good_node)["status"]["conditions"]
    controller = sky.controller
    assert controller is not None
    rounds = controller.rounds
    await eventually(lambda: controller.rounds >= rounds + 5, timeout=30, what="more rounds")
    assert sky.stack.node(good_node)["status"]["conditions"] == written
    sky.stack.sim.store.delete(SKYHOOKS, "good")

    def ours_left() -> list[str]:
        return [k for k in shown(good_node) if k.startswith("skyhook.nvidia.com/good/")]

    await eventually(lambda: not ours_left(), timeout=60, what="conditions removed")
    assert shown(good_node)["Ready"] == ("True", "KubeletReady")


async def test_rule_package_pods_find_their_config_maps_written_through_k8s_watcher(
    sky: SkyhookStack,
) -> None:
    """The node-metadata and package ConfigMaps a package pod mounts exist (upstream writes
    them before each package pod), with what the agent reads, owned by the Skyhook."""
    await sky.start()
    packages = {
        "driver": {"version": "1.0.0", "image": "registry.local/driver", "configMap": {"a": "1"}}
    }
    sky.skyhook("cm-init", packages)
    await eventually(lambda: sky.status("cm-init") == "complete", timeout=60, what="complete")
    uid = sky.get("cm-init")["metadata"]["uid"]
    store = sky.stack.sim.store
    package_cm = store.get("configmaps", "cm-init-driver-1.0.0", NS)
    assert package_cm["data"] == {"a": "1"}
    assert package_cm["metadata"]["ownerReferences"][0]["uid"] == uid
    found = store.list("configmaps", NS, label_selector="skyhook.nvidia.com/skyhook-node-meta")
    by_node = {
        cm["metadata"]["annotations"]["skyhook.nvidia.com/Node.name"]: cm for cm in found.items
    }
    assert sorted(by_node) == sorted(sky.stack.node_names())
    node = sky.stack.node_names()[0]
    data = by_node[node]["data"]
    # The node's labels as they were when it was written (only Skyhook's own marks move on).
    written = json.loads(data["labels.json"])
    now = sky.stack.node(node)["metadata"]["labels"]
    assert written and {k: v for k, v in written.items() if not k.startswith("skyhook.")} == {
        k: v for k, v in now.items() if not k.startswith("skyhook.")
    }
    assert json.loads(data["packages.json"])["packages"]["driver"]["version"] == "1.0.0"
    # Every Job's pod mounts the ConfigMap named for its node.
    for job in sky.jobs("cm-init"):
        spec = job["spec"]["template"]["spec"]
        names = {v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v}
        assert by_node[spec["nodeName"]]["metadata"]["name"] in names


async def test_runtime_required_taint_goes_on_a_new_node_and_off_once_complete(
    sky: SkyhookStack,
) -> None:
    """autoTaintNewNodes through k8s-watcher: the runtime-required taint lands on the new node
    (its autoTaint_ mark says so), the stage pods tolerate it, and it comes off once the
    runtimeRequired Skyhook is complete there; the node carries version_ beside its state."""
    await sky.start()
    node = sky.stack.node_names()[0]
    one_node = {"matchLabels": {"kubernetes.io/hostname": node}}
    packages = {"driver": {"version": "1.0.0", "image": "registry.local/driver"}}
    sky.skyhook(
        "runtime", packages, nodeSelectors=one_node, runtimeRequired=True, autoTaintNewNodes=True
    )

    def annotations() -> dict[str, str]:
        return dict(sky.stack.node(node)["metadata"].get("annotations") or {})

    await eventually(
        lambda: annotations().get("skyhook.nvidia.com/autoTaint_skyhook.nvidia.com") == "true",
        timeout=30,
        what="auto-tainted",
    )
    await eventually(lambda: sky.status("runtime") == "complete", timeout=60, what="complete")

    def untainted() -> bool:
        taints = (sky.stack.node(node).get("spec") or {}).get("taints") or []
        return not any(t.get("key") == "skyhook.nvidia.com" for t in taints)

    await eventually(untainted, timeout=30, what="runtime-required taint removed")
    assert annotations()["skyhook.nvidia.com/version_runtime"] == "v0.9.0"

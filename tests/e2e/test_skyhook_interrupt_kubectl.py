"""A Skyhook's interrupts on the whole local stack, seen only through kubectl: two packages
with an interrupt (a `reboot`, a `service`) on a node that runs an ordinary pod and a
training pod (the Skyhook's podNonInterruptLabels). `python -m maintenance_scheduler` runs as
a real process (its NodeMaintenance controller and its Skyhook controller), the simulator's
kubelet reboots a node on a `reboot` interrupt.

What must hold (docs/maintenance-scheduler.md, S15 and S16):
- the node is cordoned; the drain waits for the training pod (the test ends it once the
  request says it waits for it); then the ordinary pod is evicted, and only once it is gone
  is the first stage Job's pod (an apply) made; every stage pod is made on a cordoned node;
- one interrupt Job for the two packages: reboot wins, the service package is `skipped` at
  interrupt in the node state; the node boots once, before either post-interrupt;
- the node is uncordoned only after both post-interrupt pods succeeded, and the Skyhook is
  `complete`.

The order is read from two `kubectl get --watch` streams (pods, nodes) by resourceVersion:
the simulator, like etcd, stamps every write with one global, increasing revision, so two
objects' versions order their writes whichever stream delivered them first. A watch that
ended before the test did would have left a gap, so it fails the test instead."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeflow_runtime.natsd import free_port
from tests.e2e import processes
from tests.e2e.processes import kubectl
from tests.e2e.test_maintenance_kubectl import require_kubectl
from tests.integration.maintenance_scheduler import conftest as whole_stack
from tests.integration.maintenance_scheduler.conftest import Stack

pytestmark = pytest.mark.slow

stack = whole_stack.stack
__all__ = ["require_kubectl", "stack"]

SKYHOOK = "kernel-update"
TARGET_LABEL = "nodeflow.dev/test-interrupt"
REBOOT_PACKAGE = "kernel"
SERVICE_PACKAGE = "persistenced"
WORKLOAD = "web"
TRAINING = "training"
NAME_LABEL = "skyhook.nvidia.com/name"
STAGE_LABEL = "skyhook.nvidia.com/stage"
PACKAGE_LABEL = "skyhook.nvidia.com/package"
NODE_STATE = f"skyhook.nvidia.com/nodeState_{SKYHOOK}"


def skyhook_manifest() -> dict[str, Any]:
    """Two interrupting packages on the nodes labelled TARGET_LABEL=SKYHOOK; their Jobs are
    independent (no dependsOn), so both are under way on the node at once."""
    return {
        "apiVersion": "skyhook.nvidia.com/v1alpha1",
        "kind": "Skyhook",
        "metadata": {"name": SKYHOOK},
        "spec": {
            "nodeSelectors": {"matchLabels": {TARGET_LABEL: SKYHOOK}},
            "podNonInterruptLabels": {"matchLabels": {"app": TRAINING}},
            "packages": {
                REBOOT_PACKAGE: {
                    "version": "1.0.0",
                    "image": "registry.local/kernel",
                    "interrupt": {"type": "reboot"},
                },
                SERVICE_PACKAGE: {
                    "version": "1.0.0",
                    "image": "registry.local/persistenced",
                    "interrupt": {"type": "service", "services": ["nvidia-persistenced"]},
                },
            },
        },
    }


def workload_pod(node: str, name: str = WORKLOAD) -> dict[str, Any]:
    """A pod bound to `node` that runs until it is deleted: WORKLOAD (no label of the
    Skyhook's podNonInterruptLabels, so the drain evicts it), or TRAINING (labelled with
    them, so the drain waits for it to end)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": name, "image": f"{name}:1", "resources": {"requests": {"cpu": "100m"}}}
            ],
        },
    }


def resource_version(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


class KubectlWatch(processes.KubectlWatch):
    """`kubectl get <args> --watch --output=json --output-watch-events`: every event the API
    server sends, in its order, the existing objects first (as ADDED)."""

    def __init__(self, kubeconfig: Path, *args: str) -> None:
        super().__init__(kubeconfig, *args, "--output-watch-events")

    @property
    def events(self) -> list[tuple[str, dict[str, Any]]]:
        return [(str(event["type"]), event["object"]) for event in self.documents]


@dataclass
class PodLife:
    """One pod as the watch saw it: its first event (ADDED, at `first`: its creation, for a
    pod made after the watch listed), its versions in order, deleted at `deleted`."""

    name: str
    labels: dict[str, str]
    job: str
    first_kind: str
    first: int
    versions: list[dict[str, Any]] = field(default_factory=list)
    deleted: int | None = None

    def first_rv(self, predicate: Callable[[dict[str, Any]], object]) -> int | None:
        """The resourceVersion of the first version `predicate` holds for."""
        return next((resource_version(v) for v in self.versions if predicate(v)), None)


@dataclass
class Story:
    """What the watches saw of one node and the pods on it, in resourceVersion order."""

    node_versions: list[dict[str, Any]]
    pods: dict[str, PodLife]

    def node_at(self, rv: int) -> dict[str, Any]:
        """The node as it was when the write at `rv` happened (its last version before)."""
        before = [v for v in self.node_versions if resource_version(v) < rv]
        assert before, f"no version of the node before resourceVersion {rv}"
        return before[-1]

    def stage_pods(self, since: int) -> list[PodLife]:
        """The Skyhook's pods on the node in creation order; each made after `since` (the
        Skyhook's creation), so after the watch listed: its first event is its creation."""
        found = [p for p in self.pods.values() if p.labels.get(NAME_LABEL) == SKYHOOK]
        for pod in found:
            assert pod.first_kind == "ADDED" and pod.first > since, (pod.name, pod.first_kind)
        return sorted(found, key=lambda p: p.first)

    def node_states(self) -> list[dict[str, Any]]:
        states = []
        for version in self.node_versions:
            raw = (version["metadata"].get("annotations") or {}).get(NODE_STATE)
            if raw:
                states.append(json.loads(raw))
        return states


def story_of(pods: KubectlWatch, nodes: KubectlWatch, node: str) -> Story:
    node_versions = [obj for _, obj in nodes.events if obj["metadata"]["name"] == node]
    lives: dict[str, PodLife] = {}
    for kind, obj in pods.events:
        if (obj.get("spec") or {}).get("nodeName") != node:
            continue
        meta = obj["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        life = lives.get(key)
        if life is None:
            owners = [o["name"] for o in meta.get("ownerReferences") or [] if o["kind"] == "Job"]
            labels = dict(meta.get("labels") or {})
            life = PodLife(key, labels, "".join(owners), kind, resource_version(obj))
            lives[key] = life
        life.versions.append(obj)
        if kind == "DELETED":
            life.deleted = resource_version(obj)
    return Story(node_versions, lives)


def cordoned_at(story: Story) -> int:
    return next(resource_version(v) for v in story.node_versions if v["spec"].get("unschedulable"))


def assert_drained_before_every_stage(story: Story, skyhook_created: int) -> list[PodLife]:
    """S15: cordon; the training pod's end; then the workload pod evicted and gone; then the
    first stage pod (an apply); every stage pod made on a cordoned node. The stage pods, in
    creation order."""
    assert not story.node_versions[0]["spec"].get("unschedulable"), "cordoned from the start"
    cordoned = cordoned_at(story)
    training = story.pods[f"default/{TRAINING}"]
    ended = training.first_rv(lambda v: v["metadata"].get("deletionTimestamp"))
    workload = story.pods[f"default/{WORKLOAD}"]
    evicted = workload.first_rv(lambda v: v["metadata"].get("deletionTimestamp"))
    assert ended is not None and evicted is not None and workload.deleted is not None
    stage_pods = story.stage_pods(skyhook_created)
    assert stage_pods, "no stage pod ran on the node"
    first_stage = stage_pods[0]
    assert first_stage.labels[STAGE_LABEL] == "apply", first_stage.labels
    assert cordoned < ended < evicted <= workload.deleted < first_stage.first, (
        f"cordon at {cordoned}, training pod ended at {ended}, eviction at {evicted}, "
        f"pod gone at {workload.deleted}, first stage pod ({first_stage.name}) at "
        f"{first_stage.first}"
    )
    for pod in stage_pods:
        assert story.node_at(pod.first)["spec"].get("unschedulable"), (
            f"{pod.name} ({pod.labels[STAGE_LABEL]}) made on an uncordoned node"
        )
    return stage_pods


def of_stage(stage_pods: list[PodLife], stage: str) -> list[PodLife]:
    return [p for p in stage_pods if p.labels[STAGE_LABEL] == stage]


def assert_one_merged_interrupt(story: Story, stage_pods: list[PodLife]) -> PodLife:
    """S16: one interrupt Job, the reboot package's; the service package `skipped` at
    interrupt; both packages' post-interrupt after it. The interrupt pod."""
    interrupts = of_stage(stage_pods, "interrupt")
    assert len({p.job for p in interrupts}) == 1, [p.name for p in interrupts]
    interrupt = interrupts[0]
    assert interrupt.labels[PACKAGE_LABEL] == REBOOT_PACKAGE, interrupt.labels
    skipped = [
        entry
        for state in story.node_states()
        for entry in state.values()
        if entry.get("name") == SERVICE_PACKAGE
        and (entry.get("stage"), entry.get("state")) == ("interrupt", "skipped")
    ]
    assert skipped, f"{SERVICE_PACKAGE} never skipped at interrupt: {story.node_states()}"
    posts = of_stage(stage_pods, "post-interrupt")
    packages = sorted(p.labels[PACKAGE_LABEL] for p in posts)
    assert packages == sorted([REBOOT_PACKAGE, SERVICE_PACKAGE]), packages
    assert all(p.first > interrupt.first for p in posts)
    return interrupt


def assert_uncordoned_after_post_interrupt(story: Story, stage_pods: list[PodLife]) -> None:
    """The request released (the node uncordoned) only after both post-interrupt pods
    succeeded, and never before: the node stayed cordoned from the cordon until then."""
    cordoned = cordoned_at(story)
    uncordoned = next(
        resource_version(v)
        for v in story.node_versions
        if resource_version(v) > cordoned and not v["spec"].get("unschedulable")
    )
    for pod in of_stage(stage_pods, "post-interrupt"):
        succeeded = pod.first_rv(lambda v: (v.get("status") or {}).get("phase") == "Succeeded")
        assert succeeded is not None and succeeded < uncordoned, (
            f"uncordoned at {uncordoned}, {pod.name} succeeded at {succeeded}"
        )
    assert not story.node_versions[-1]["spec"].get("unschedulable")


def boot_changes(story: Story) -> list[dict[str, Any]]:
    """The node's versions where its boot ID differs from the one before (the first too)."""
    boots = [story.node_versions[0]]
    for version in story.node_versions[1:]:
        if version["status"]["nodeInfo"]["bootID"] != boots[-1]["status"]["nodeInfo"]["bootID"]:
            boots.append(version)
    return boots


async def wait_for(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"not reached within {timeout:.0f} s: {what}"
        await asyncio.sleep(0.3)


Kubectl = Callable[..., Awaitable[str]]  # kubectl(*args, stdin=...) -> its output


async def run_interrupts(
    run: Kubectl, kubeconfig: Path, node: str, timeout: float
) -> tuple[Story, int]:
    """The scenario on `node`, through `run` (kubectl on the stack): the two pods, the
    watches, the Skyhook; the training pod deleted once the request waits for it; then until
    the Skyhook is complete, its request gone and the node uncordoned. What the watches saw,
    and the Skyhook's creation resourceVersion."""
    await run("label", "node", node, f"{TARGET_LABEL}={SKYHOOK}")
    pods_yaml = yaml.safe_dump_all([workload_pod(node), workload_pod(node, TRAINING)])
    await run("apply", "-f", "-", stdin=pods_yaml)

    async def running() -> bool:
        phases = await run(
            "get", "pods", WORKLOAD, TRAINING, "-o", "jsonpath={.items[*].status.phase}"
        )
        return phases.split() == ["Running", "Running"]

    await wait_for(running, "both pods Running", timeout)
    async with (
        KubectlWatch(kubeconfig, "pods", "--all-namespaces") as pods,
        KubectlWatch(kubeconfig, "nodes") as nodes,
    ):

        async def listed() -> bool:
            names = {o["metadata"]["name"] for _, o in [*pods.events, *nodes.events]}
            return {WORKLOAD, TRAINING, node} <= names

        await wait_for(listed, "both watches listing", timeout)
        created = await run(
            "create",
            "-f",
            "-",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
            stdin=yaml.safe_dump(skyhook_manifest()),
        )

        async def waiting_for_training() -> bool:
            reasons = await run(
                "get",
                "nodemaintenances",
                "-A",
                "-l",
                f"{NAME_LABEL}={SKYHOOK}",
                "-o",
                'jsonpath={.items[*].status.conditions[?(@.type=="Ready")].reason}',
            )
            return reasons.split() == ["WaitForPodCompletion"]

        await wait_for(waiting_for_training, "the request waiting for the training pod", timeout)
        await run("delete", "pod", TRAINING, "--wait=false")

        async def complete_and_released() -> bool:
            status = await run("get", "skyhooks", SKYHOOK, "-o", "jsonpath={.status.status}")
            requests = await run("get", "nodemaintenances", "-A", "-o", "name", "-l", NAME_LABEL)
            cordon = await run("get", "node", node, "-o", "jsonpath={.spec.unschedulable}")
            return status.strip() == "complete" and not requests.strip() and not cordon.strip()

        await wait_for(complete_and_released, "Skyhook complete, node released", timeout)

        async def uncordon_seen() -> bool:
            versions = story_of(pods, nodes, node).node_versions
            return bool(versions) and not versions[-1]["spec"].get("unschedulable")

        await wait_for(uncordon_seen, "the node watch saw the uncordon", timeout)
        pods.assert_unbroken()
        nodes.assert_unbroken()
        return story_of(pods, nodes, node), int(created)


async def start_process(running: Stack, port: int) -> asyncio.subprocess.Process:
    return await processes.start_service(
        "maintenance_scheduler",
        running,
        port,
        "e2e-skyhook-interrupt",
        OPERATOR_NAMESPACE="default",
        SKYHOOK_NAMESPACE="default",
    )


async def test_reboot_and_service_interrupts_drain_first_merge_into_one_and_uncordon(
    stack: Stack,
) -> None:
    port = free_port()
    process = await start_process(stack, port)

    async def run(*args: str, stdin: str | None = None) -> str:
        return await kubectl(stack, *args, stdin=stdin)

    try:
        await processes.wait_ready(port, "maintenance-scheduler process", timeout=30)
        node = stack.node_names()[0]
        story, created = await run_interrupts(run, Path(stack.sim.kubeconfig_path), node, 90)

        stage_pods = assert_drained_before_every_stage(story, created)
        interrupt = assert_one_merged_interrupt(story, stage_pods)
        assert_uncordoned_after_post_interrupt(story, stage_pods)

        # The reboot: the node booted once, after the interrupt pod was made and before
        # either post-interrupt pod.
        boots = boot_changes(story)
        assert len(boots) == 2, [b["status"]["nodeInfo"]["bootID"] for b in boots]
        rebooted = resource_version(boots[1])
        assert interrupt.first < rebooted
        assert all(rebooted < p.first for p in of_stage(stage_pods, "post-interrupt"))

        # kubectl's own reading of the Jobs: one interrupt Job, the reboot package's.
        selector = f"{NAME_LABEL}={SKYHOOK},{STAGE_LABEL}=interrupt"
        jobs = json.loads(await run("get", "jobs", "-A", "-l", selector, "-o", "json"))
        assert [j["metadata"]["labels"][PACKAGE_LABEL] for j in jobs["items"]] == [REBOOT_PACKAGE]
    finally:
        await processes.stop_processes(process)

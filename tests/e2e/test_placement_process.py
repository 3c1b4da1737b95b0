"""`python -m topology_placer` as a real process on the placement stack, driven by kubectl:
a gang applied with `kubectl apply` is nominated, the placer is killed with SIGKILL as soon
as the nominations appear, and a new process finishes the gang inside one block from
Kubernetes state alone, with no node booked twice; a MustGather gang that fits nowhere shows
its reason in numbers through `kubectl get`."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeflow_contracts.ledger import LANDING_MARGIN_SECONDS
from nodeflow_runtime.natsd import free_port
from tests.e2e import processes
from tests.integration.topology_placer import conftest as placement_stack
from tests.integration.topology_placer.conftest import (
    BLOCK,
    Stack,
    eventually,
    gang_pod,
    pod_group_object,
    topology_object,
)
from topology_placer.commands import COMMAND_LIFETIME_SECONDS

stack = placement_stack.stack
BLOCK_MUST = json.dumps({"gatherStrategy": [{"layer": "BlockLayer", "strategy": "MustGather"}]})


@pytest.fixture(autouse=True)
def require_kubectl() -> None:
    if processes.KUBECTL is None:
        pytest.skip("kubectl not installed (apt-get install kubernetes-client)")


async def kubectl(running: Stack, *args: str) -> str:
    return await processes.kubectl(running, "--namespace=default", *args)


async def start_placer(running: Stack, port: int, name: str) -> asyncio.subprocess.Process:
    # IN_FLIGHT_TIMEOUT_SECONDS keeps its default: below the 30 s command lifetime the placer
    # refuses to start.
    return await processes.start_service("topology_placer", running, port, name)


async def apply(running: Stack, tmp_path: Path, docs: list[dict[str, Any]]) -> None:
    manifest = tmp_path / "gang.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    await kubectl(running, "apply", "-f", str(manifest))


async def test_placer_process_killed_mid_gang_finishes_it_in_one_block(
    stack: Stack, tmp_path: Path
) -> None:
    docs = [topology_object(), pod_group_object("train", 4, BLOCK_MUST)]
    docs += [gang_pod(f"train-{rank}", "train", gpus=4, index=rank) for rank in range(4)]
    await apply(stack, tmp_path, docs)
    first = await start_placer(stack, free_port(), "e2e-placer-1")
    second: asyncio.subprocess.Process | None = None
    try:
        await eventually(
            lambda: any(p["status"].get("nominatedNodeName") for p in stack.pods("train")),
            what="the first placer's nominations",
        )
        first.send_signal(signal.SIGKILL)
        await first.wait()
        port = free_port()
        second = await start_placer(stack, port, "e2e-placer-2")
        await processes.wait_ready(port, "placer process")

        def bound() -> dict[str, str]:
            return {
                p["metadata"]["name"]: p["spec"]["nodeName"]
                for p in stack.pods("train")
                if p["spec"].get("nodeName")
            }

        # The kill may fall between the first placer's ledger record of the bindings and
        # their publication: the new leader then holds those pods and nodes until the
        # bindings can no longer land (fail closed), so it may finish the gang only then.
        may_land_for = COMMAND_LIFETIME_SECONDS + LANDING_MARGIN_SECONDS
        placed = await eventually(
            lambda: len(bound()) == 4 and bound(), timeout=may_land_for + 20, what="gang bound"
        )
        assert len({stack.node_labels(node)[BLOCK] for node in placed.values()}) == 1
        per_node: dict[str, int] = {}
        for node in placed.values():
            per_node[node] = per_node.get(node, 0) + 4
        assert all(gpus <= 8 for gpus in per_node.values())
        await eventually(
            lambda: (
                stack.pod_group("train").get("status", {}).get("phase") in ("Scheduled", "Running")
            ),
            what="PodGroup phase",
        )
        shown = await kubectl(stack, "get", "podgroup", "train", "-o", "jsonpath={.status.phase}")
        assert shown in ("Scheduled", "Running")
    finally:
        await processes.stop_processes(first, second, grace=20)


async def test_must_gather_failure_shows_its_reason_through_kubectl(
    stack: Stack, tmp_path: Path
) -> None:
    docs = [topology_object(), pod_group_object("big", 3, BLOCK_MUST)]
    docs += [gang_pod(f"big-{rank}", "big", gpus=8) for rank in range(3)]
    await apply(stack, tmp_path, docs)
    process = await start_placer(stack, free_port(), "e2e-placer-3")
    try:
        expected = (
            "MustGather BlockLayer: no BlockLayer domain offers 3 slots; "
            "best spine-0/block-0 offers 2"
        )

        async def shown() -> str:
            return await kubectl(
                stack,
                "get",
                "pod",
                "big-0",
                "-o",
                'jsonpath={.status.conditions[?(@.type=="PodScheduled")].message}',
            )

        deadline = time.monotonic() + 20
        while (text := await shown()) != expected:
            assert time.monotonic() < deadline, f"PodScheduled message: {text!r}"
            await asyncio.sleep(0.2)
        events = await kubectl(stack, "get", "events", "-o", "json")
        reasons = {e["reason"] for e in json.loads(events)["items"]}
        assert "FailedScheduling" in reasons
    finally:
        await processes.stop_processes(process, grace=20)


async def test_gang_group_applied_with_kubectl_is_bound_whole(stack: Stack, tmp_path: Path) -> None:
    members = json.dumps(["default/master", "default/worker"])
    groups = [pod_group_object("master", 1), pod_group_object("worker", 2)]
    for group in groups:
        group["metadata"]["annotations"]["gang.scheduling.koordinator.sh/groups"] = members
    docs: list[dict[str, Any]] = [topology_object(), *groups]
    docs.append(gang_pod("master-0", "master", gpus=8, index=0))
    docs.append(gang_pod("worker-0", "worker", gpus=8, index=1))
    await apply(stack, tmp_path, docs)
    process = await start_placer(stack, free_port(), "e2e-placer-4")
    try:
        waiting = await eventually(
            lambda: [
                c.get("message", "")
                for c in stack.pods("master")[0].get("status", {}).get("conditions") or []
                if c.get("type") == "PodScheduled" and c.get("status") == "False"
            ],
            what="the GangGroup waits for its second worker",
        )
        assert waiting == [
            "waiting for members: PodGroup default/worker has 1 of minMember 2 pods "
            "(once-satisfied)"
        ]
        assert not any(p["spec"].get("nodeName") for p in stack.pods("master"))
        await apply(stack, tmp_path, [gang_pod("worker-1", "worker", gpus=8, index=2)])

        def everyone() -> list[dict[str, Any]]:
            return stack.pods("master") + stack.pods("worker")

        await eventually(
            lambda: len(everyone()) == 3 and all(p["spec"].get("nodeName") for p in everyone()),
            timeout=30,
            what="the whole GangGroup bound",
        )
        await eventually(
            lambda: all(
                stack.pod_group(name).get("status", {}).get("phase") in ("Scheduled", "Running")
                for name in ("master", "worker")
            ),
            what="both PodGroups Scheduled or Running",
        )
        phases = await kubectl(stack, "get", "podgroups", "-o", "jsonpath={.items[*].status.phase}")
        assert set(phases.split()) <= {"Scheduled", "Running"}
    finally:
        await processes.stop_processes(process, grace=20)


class KubectlWatch(processes.KubectlWatch):
    """The selected pods of `default`, every version the API server sends."""

    def __init__(self, running: Stack, selector: str) -> None:
        kubeconfig = Path(running.sim.kubeconfig_path)
        super().__init__(kubeconfig, "pods", "--namespace=default", f"--selector={selector}")

    @property
    def versions(self) -> list[dict[str, Any]]:
        return self.documents

    def history(self, name: str) -> list[dict[str, Any]]:
        return [v for v in self.versions if v["metadata"]["name"] == name]


def disruption_target(pod: dict[str, Any]) -> dict[str, Any] | None:
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == "DisruptionTarget":
            return dict(condition)
    return None


async def test_preemption_through_kubectl_marks_victims_then_nominates_and_binds_the_gang(
    stack: Stack, tmp_path: Path
) -> None:
    classes: list[dict[str, Any]] = [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        for name, value in (("batch-low", 1), ("training-high", 1000))
    ]
    # Every node taken by a low-priority pod of the default scheduler.
    low_pods = []
    for index in range(8):
        low = gang_pod(f"low-{index}", "low", gpus=8)
        low["metadata"]["labels"] = {"app": "low"}
        low["spec"]["schedulerName"] = "default-scheduler"
        low["spec"]["priorityClassName"] = "batch-low"
        low_pods.append(low)
    await apply(stack, tmp_path, [topology_object(), *classes, *low_pods])
    await eventually(
        lambda: all(
            p["spec"].get("nodeName")
            for p in stack.sim.store.list("pods", namespace="default").items
            if p["metadata"]["name"].startswith("low-")
        ),
        what="the low-priority pods bound by the default scheduler",
    )
    priorities = await kubectl(stack, "get", "pods", "-l", "app=low", "-o", "jsonpath={..priority}")
    assert set(priorities.split()) == {"1"}
    high = [gang_pod(f"preemptor-pod-{rank}", "hello-job", gpus=8) for rank in (1, 2)]
    for pod in high:
        pod["spec"]["priorityClassName"] = "training-high"
    process = await start_placer(stack, free_port(), "e2e-placer-5")
    try:
        async with (
            KubectlWatch(stack, "app=low") as victims,
            KubectlWatch(stack, "pod-group.scheduling.sigs.k8s.io=hello-job") as gang,
        ):
            await apply(stack, tmp_path, [pod_group_object("hello-job", 2), *high])

            def bound() -> dict[str, str]:
                return {
                    p["metadata"]["name"]: p["spec"]["nodeName"]
                    for p in stack.pods("hello-job")
                    if p["spec"].get("nodeName")
                }

            placed = await eventually(lambda: len(bound()) == 2 and bound(), timeout=30)
            # The watches catch up with the binding.
            await eventually(
                lambda: all(
                    any(v["spec"].get("nodeName") for v in gang.history(name)) for name in placed
                ),
                what="kubectl's watch shows the bindings",
            )
        marked = {
            version["metadata"]["name"]: condition
            for version in victims.versions
            if (condition := disruption_target(version)) is not None
        }
        # The victims are the two low-priority pods on the nodes the gang now holds.
        evicted_nodes = {
            v["spec"]["nodeName"] for v in victims.versions if v["metadata"]["name"] in marked
        }
        assert len(marked) == 2
        assert evicted_nodes == set(placed.values())
        for condition in marked.values():
            assert condition["status"] == "True"
            assert condition["reason"] == "PreemptionByScheduler"
            assert condition["message"] == (
                "nodeflow-placer: preempting to accommodate higher priority pods, preemptor: "
                "default/hello-job, triggerpod: default/preemptor-pod-1"
            )
        # Each member is nominated (status.nominatedNodeName, no node yet) before it is bound
        # to that node.
        for name, node in placed.items():
            history = gang.history(name)
            first_bound = next(i for i, v in enumerate(history) if v["spec"].get("nodeName"))
            nominated = [
                v["status"].get("nominatedNodeName")
                for v in history[:first_bound]
                if v["status"].get("nominatedNodeName")
            ]
            assert nominated and nominated[-1] == node, (name, nominated, node)
        survivors = await kubectl(stack, "get", "pods", "-l", "app=low", "-o", "json")
        live = [
            p for p in json.loads(survivors)["items"] if not p["metadata"].get("deletionTimestamp")
        ]
        assert len(live) == 6
        assert {p["spec"]["nodeName"] for p in live}.isdisjoint(placed.values())
    finally:
        await processes.stop_processes(process, grace=20)

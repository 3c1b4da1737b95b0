"""The chaos suite's recorder catches each rule it holds when the rule is broken on purpose,
through the same APIs an operator would misuse (so a chaos test that passes means something):
a busy NodeSet pod deleted by hand, a stray pod on a NodeSet's node, a rolling budget
exceeded, two nodes cordoned past maxUnavailable, two NodeMaintenances in progress past
maxParallelOperations, and a gang bound in part."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.chaos_support import (
    NODE_MAINTENANCES,
    NODES,
    NODESETS,
    OPERATOR_CONFIGS,
    OPERATOR_NAMESPACE,
    POD_GROUP_LABEL,
    POD_GROUPS,
    PODS,
    Recorder,
    is_true,
    launched_stack,
    recording,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOPOLOGY = "spines=1,blocks_per_spine=2,nodes_per_block=2"


def plain_pod(name: str, node: str | None, labels: dict[str, str]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1,
        # Nobody schedules it: it stays unbound unless nodeName is given.
        "schedulerName": "nobody",
        "containers": [{"name": "c", "image": "c:1", "resources": {"requests": {"cpu": "1"}}}],
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": spec,
    }


async def caught(recorder: Recorder, rule: str) -> None:
    async def seen() -> bool:
        return any(v.rule == rule for v in recorder.violations)

    await wait_until(seen, 60, f"the recorder catching {rule}")


async def test_recorder_catches_every_rule_broken_on_purpose(tmp_path: Path) -> None:
    async with (
        launched_stack(tmp_path / "run", 4, TOPOLOGY) as stack,
        recording(stack, gang_settle_seconds=1.0) as recorder,
    ):
        kube, slurm = stack.kube, stack.slurm
        await kube.create(
            NODESETS,
            {
                "apiVersion": "nodeflow.dev/v1alpha1",
                "kind": "NodeSet",
                "metadata": {"name": "victim", "namespace": "default"},
                "spec": {
                    "replicas": 1,
                    "slurmCluster": "sim",
                    "template": {
                        "metadata": {"labels": {"app": "slurmd"}},
                        "spec": {
                            "terminationGracePeriodSeconds": 1,
                            "containers": [
                                {
                                    "name": "slurmd",
                                    "image": "slurmd:24.11",
                                    "resources": {"requests": {"cpu": "1"}},
                                }
                            ],
                        },
                    },
                },
            },
        )

        async def registered() -> bool:
            pods = recorder.live_pods("victim")
            if len(pods) != 1 or not is_true(pods[0], "Ready"):
                return False
            return "IDLE" in (await slurm.nodes()).get(pods[0]["metadata"]["name"], [])

        await wait_until(registered, 60, "the NodeSet pod Ready and idle in Slurm")
        pod = recorder.live_pods("victim")[0]
        name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]

        # A second pod of the NodeSet on the same node: two on one node, more than replicas.
        await kube.create(PODS, plain_pod("stray", node, {"nodeflow.dev/nodeset": "victim"}))
        await caught(recorder, "two-pods-on-one-node")
        await caught(recorder, "duplicate-pod")

        # The rolling budget: with none allowed, one pod going away exceeds it.
        recorder.arm_rolling_budget("victim", replicas=1, max_unavailable=0)

        # A busy pod deleted by hand.
        job = await slurm.run_job(name)

        async def busy() -> bool:
            return "ALLOCATED" in (await slurm.nodes()).get(name, [])

        await wait_until(busy, 30, "the job running")
        await kube.delete(f"{PODS}/{name}")
        await caught(recorder, "busy-pod-deleted")
        await caught(recorder, "rolling-budget")
        await slurm.end_job(job)

        # Maintenance budgets of 1, broken by hand.
        await kube.create(
            OPERATOR_CONFIGS,
            {
                "apiVersion": "maintenance.nvidia.com/v1alpha1",
                "kind": "MaintenanceOperatorConfig",
                "metadata": {"name": "default", "namespace": OPERATOR_NAMESPACE},
                "spec": {"maxParallelOperations": 1, "maxUnavailable": 1},
            },
        )

        async def config_seen() -> bool:
            return recorder.operator_config is not None

        await wait_until(config_seen, 30, "the MaintenanceOperatorConfig watched")
        first, second = sorted(recorder.nodes)[:2]
        for cordoned in (first, second):
            await kube.merge_patch(f"{NODES}/{cordoned}", {"spec": {"unschedulable": True}})
        await caught(recorder, "maintenance-unavailable")
        for index, target in enumerate((first, second)):
            request = f"by-hand-{index}"
            await kube.create(
                NODE_MAINTENANCES,
                {
                    "apiVersion": "maintenance.nvidia.com/v1alpha1",
                    "kind": "NodeMaintenance",
                    "metadata": {"name": request, "namespace": "default"},
                    # A requestor the scheduler ignores nothing of: it is the status below,
                    # written by hand, that breaks the budget.
                    "spec": {"requestorID": "by.hand", "nodeName": target},
                },
            )
            await kube.merge_patch(
                f"{NODE_MAINTENANCES}/{request}/status",
                {
                    "status": {
                        "conditions": [
                            {
                                "type": "Ready",
                                "status": "False",
                                "reason": "Draining",
                                "message": "by hand",
                                "lastTransitionTime": "2026-01-01T00:00:00Z",
                            }
                        ]
                    }
                },
            )
        await caught(recorder, "maintenance-parallel")

        # A gang of 2 with one member bound by hand and the other left unbound.
        await kube.create(
            POD_GROUPS,
            {
                "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": "half", "namespace": "default"},
                "spec": {"minMember": 2},
            },
        )
        free = sorted(recorder.nodes)[-1]
        await kube.create(PODS, plain_pod("half-0", free, {POD_GROUP_LABEL: "half"}))
        await kube.create(PODS, plain_pod("half-1", None, {POD_GROUP_LABEL: "half"}))
        await caught(recorder, "partial-gang")
        with pytest.raises(AssertionError, match="partial gangs at quiescence"):
            recorder.assert_quiescent()
        with pytest.raises(AssertionError, match="safety rules broken"):
            recorder.assert_no_violation()

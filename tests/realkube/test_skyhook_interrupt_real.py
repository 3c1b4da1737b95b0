"""A Skyhook's interrupts on the real control plane: the scenario of
tests/e2e/test_skyhook_interrupt_kubectl.py (two interrupting packages, a `reboot` and a
`service`, on a node running an ordinary pod and a podNonInterruptLabels pod) on a KWOK node,
with the real Job controller running the stage Jobs and maintenance-scheduler's
NodeMaintenance drain evicting through the real eviction API (KWOK then deletes the
terminating pod). The same kubectl watches read the order by resourceVersion: etcd's
revision, one increasing counter for every object.

KWOK runs no container and cannot reboot a node: the interrupt Job's pod just completes and
the node keeps its boot ID, so the reboot itself is the e2e's (the simulated kubelet's) to
show. Held here: the node cordoned, the drain waiting for the training pod, the other pod
evicted and gone before the first stage pod (an apply), every stage pod made on a cordoned
node; one interrupt Job for the two packages (the service package `skipped`); the node
uncordoned only after both post-interrupt pods succeeded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_skyhook_interrupt_kubectl import (
    NAME_LABEL,
    PACKAGE_LABEL,
    REBOOT_PACKAGE,
    SKYHOOK,
    STAGE_LABEL,
    TARGET_LABEL,
    TRAINING,
    WORKLOAD,
    assert_drained_before_every_stage,
    assert_one_merged_interrupt,
    assert_uncordoned_after_post_interrupt,
    run_interrupts,
)
from tests.realkube.stack import real_stack
from tests.realkube.support import STEP_TIMEOUT, admin_kubeconfig, kubectl, until
from tests.realkube.test_skyhook_real import SKYHOOK_NAMESPACE, ensure_namespace

pytestmark = [pytest.mark.real_kube, pytest.mark.timeout(600)]


async def run(*args: str, stdin: str | None = None) -> str:
    return (await kubectl(*args, stdin=stdin))[1]


async def test_interrupts_drain_first_merge_into_one_and_uncordon_on_kwok(tmp_path: Path) -> None:
    async with real_stack(tmp_path) as stack:
        # A plain KWOK node (no taint, no GPU) that real_kube.sh's named-nodes makes and no
        # other real-cluster test selects (they take the first of the sorted nodes).
        node = "node-b"
        assert node in {n["metadata"]["name"] for n in await stack.kube.items("/api/v1/nodes")}
        try:
            await ensure_namespace(stack)
            story, created = await run_interrupts(run, admin_kubeconfig(), node, STEP_TIMEOUT * 2)
            stage_pods = assert_drained_before_every_stage(story, created)
            assert_one_merged_interrupt(story, stage_pods)
            assert_uncordoned_after_post_interrupt(story, stage_pods)

            # The real Job controller's reading: one interrupt Job, the reboot package's,
            # Complete.
            selector = f"{NAME_LABEL}={SKYHOOK},{STAGE_LABEL}=interrupt"
            got = await run("get", "jobs", "-n", SKYHOOK_NAMESPACE, "-l", selector, "-o", "json")
            jobs = json.loads(got)["items"]
            assert [j["metadata"]["labels"][PACKAGE_LABEL] for j in jobs] == [REBOOT_PACKAGE]
            (conditions,) = [j["status"].get("conditions") or [] for j in jobs]
            assert {"type": "Complete", "status": "True"}.items() <= next(
                c for c in conditions if c["type"] == "Complete"
            ).items()
        finally:
            # The control plane outlives the test: leave the node as it was.
            await kubectl("delete", "skyhooks", SKYHOOK, "--ignore-not-found", check=False)
            await kubectl("delete", "pods", WORKLOAD, TRAINING, "--ignore-not-found", check=False)

            async def skyhook_gone() -> bool:
                code, _, _ = await kubectl("get", "skyhooks", SKYHOOK, check=False)
                return code != 0

            await until(skyhook_gone, "the Skyhook gone (its finalizer done)", STEP_TIMEOUT * 2)
            await kubectl("label", "node", node, f"{TARGET_LABEL}-", check=False)
            await kubectl("uncordon", node, check=False)

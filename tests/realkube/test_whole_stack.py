"""The whole stack on the real control plane (kube-apiserver, kube-controller-manager,
kube-scheduler, KWOK nodes) with the Slurm emulator following its pods: a NodeSet scales out
to Ready pods on KWOK nodes, scales in safely while a Slurm job runs, rolls out a new
template within its unavailability budget, and keeps a pod running a job from `kubectl drain`
(its PodDisruptionBudget, kube-controller-manager's disruption controller), with the chaos
suite's recorder of safety rules watching the real API server and Slurm throughout."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from nodeflow_contracts.pod_protocol import NODESET_LABEL, POD_PROTECT_LABEL, SLURM_DELETE_CONDITION
from tests.e2e.chaos_support import NODESETS, is_true, recording, terminating
from tests.realkube.stack import nodeset_pods, ready_and_idle, real_stack, remove_nodeset
from tests.realkube.support import STEP_TIMEOUT, kubectl, until

pytestmark = [pytest.mark.real_kube, pytest.mark.timeout(600)]

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
REVISION = "controller-revision-hash"


def template(version: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "slurmd"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "slurmd",
                    "image": "slurmd:24.11",
                    "env": [{"name": "VERSION", "value": version}],
                    "resources": {"requests": {"cpu": "1"}},
                }
            ],
        },
    }


def nodeset(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "nodeflow.dev/v1alpha1",
        "kind": "NodeSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "slurmCluster": "sim",
            "template": template("v1"),
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
        },
    }


async def test_nodeset_scales_out_to_ready_pods_on_kwok_nodes_registered_in_slurm(
    tmp_path: Path,
) -> None:
    async with real_stack(tmp_path) as stack, recording(stack) as recorder:
        try:
            await stack.kube.create(NODESETS, nodeset("out", 4))
            names = await ready_and_idle(stack, recorder, "out", 4)
            pods = [recorder.pods[name] for name in names]
            # kube-scheduler bound each to its own KWOK node, which KWOK runs.
            bound = {p["spec"]["nodeName"] for p in pods}
            assert len(bound) == 4
            for node in bound:
                got = await stack.kube.call("GET", f"/api/v1/nodes/{node}")
                assert got["metadata"]["annotations"][KWOK_NODE_ANNOTATION] == "fake"
            assert all(p["status"]["phase"] == "Running" for p in pods)

            async def status_counts_them() -> bool:
                got = await stack.kube.call("GET", f"{NODESETS}/out")
                return bool((got.get("status") or {}).get("numberReady") == 4)

            await until(status_counts_them, "NodeSet status numberReady 4")
            recorder.assert_quiescent()
        finally:
            await remove_nodeset(stack, recorder, "out")
        recorder.assert_quiescent()


async def test_safe_scale_in_keeps_the_pod_whose_slurm_node_runs_a_job_until_it_ends(
    tmp_path: Path,
) -> None:
    async with real_stack(tmp_path) as stack, recording(stack) as recorder:
        try:
            await stack.kube.create(NODESETS, nodeset("in", 2))
            busy, idle = await ready_and_idle(stack, recorder, "in", 2)
            job = await stack.slurm.run_job(busy)

            async def allocated() -> bool:
                return "ALLOCATED" in (await stack.slurm.nodes()).get(busy, [])

            await until(allocated, f"job {job} running on {busy}")
            await stack.kube.merge_patch(f"{NODESETS}/in", {"spec": {"replicas": 0}})

            async def idle_pod_gone() -> bool:
                return idle not in recorder.pods

            await until(idle_pod_gone, f"the idle pod {idle} deleted")
            # The busy one stays, marked for deletion and drained in Slurm, its job running.
            kept = recorder.pods[busy]
            assert not terminating(kept)

            async def marked_and_draining() -> bool:
                pod = recorder.pods[busy]
                return is_true(pod, SLURM_DELETE_CONDITION) and "DRAIN" in (
                    await stack.slurm.nodes()
                ).get(busy, [])

            await until(marked_and_draining, f"{busy} marked SlurmDelete and draining")
            assert not terminating(recorder.pods[busy])
            assert "RUNNING" in (await stack.slurm.jobs())[job][0]

            await stack.slurm.end_job(job)

            async def busy_pod_gone() -> bool:
                return not nodeset_pods(recorder, "in")

            await until(busy_pod_gone, f"{busy} deleted once its job ended")
            recorder.assert_quiescent()
        finally:
            await remove_nodeset(stack, recorder, "in")


async def test_rolling_update_keeps_the_unavailable_budget(tmp_path: Path) -> None:
    async with real_stack(tmp_path) as stack, recording(stack) as recorder:
        try:
            await stack.kube.create(NODESETS, nodeset("roll", 3))
            names = await ready_and_idle(stack, recorder, "roll", 3)
            old = {recorder.pods[name]["metadata"]["labels"][REVISION] for name in names}
            assert len(old) == 1
            recorder.arm_rolling_budget("roll", replicas=3, max_unavailable=1)
            await stack.kube.merge_patch(f"{NODESETS}/roll", {"spec": {"template": template("v2")}})

            def rolled_out() -> bool:
                pods = nodeset_pods(recorder, "roll")
                return len(pods) == 3 and all(
                    is_true(p, "Ready")
                    and not terminating(p)
                    and p["metadata"]["labels"].get(REVISION) not in old
                    for p in pods
                )

            await recorder.converged(
                rolled_out, time.monotonic(), "rolling update of 3 pods", STEP_TIMEOUT * 2
            )
            recorder.assert_quiescent()
            del recorder.rolling["roll"]  # the scale-down that cleans up is not an update
        finally:
            await remove_nodeset(stack, recorder, "roll")


async def test_a_pod_running_a_slurm_job_is_not_evicted_by_kubectl_drain(tmp_path: Path) -> None:
    """Rule 4a of docs/nodeset-controller.md on the real API server: the NodeSet's budget
    (maxUnavailable 0 over the protect label) makes `kubectl drain` give up on the busy pod,
    and once the job ends the label goes and the same drain evicts it."""
    budget = "/apis/policy/v1/namespaces/default/poddisruptionbudgets/slurm-workers-pdb-guard"
    async with real_stack(tmp_path) as stack, recording(stack) as recorder:
        node = ""
        try:
            await stack.kube.create(NODESETS, nodeset("guard", 1))
            (name,) = await ready_and_idle(stack, recorder, "guard", 1)
            node = recorder.pods[name]["spec"]["nodeName"]
            uid = recorder.pods[name]["metadata"]["uid"]

            async def budget_made() -> bool:
                try:
                    got = await stack.kube.call("GET", budget)
                except RuntimeError:
                    return False
                return bool(got["spec"].get("minAvailable") == 2147483647)

            await until(budget_made, "the NodeSet's PodDisruptionBudget")
            job = await stack.slurm.run_job(name)

            async def protected() -> bool:
                labels = recorder.pods[name]["metadata"].get("labels") or {}
                return labels.get(POD_PROTECT_LABEL) == "true"

            await until(protected, f"{name} labelled protected while job {job} runs")
            drain = (
                "drain",
                node,
                "--disable-eviction=false",
                f"--pod-selector={NODESET_LABEL}=guard",
                "--ignore-daemonsets",
                "--delete-emptydir-data",
            )
            code, out, err = await kubectl(*drain, "--timeout=8s", check=False)
            assert code != 0, out + err
            assert "violate the pod's disruption budget" in out + err, out + err
            assert recorder.pods[name]["metadata"]["uid"] == uid
            assert not terminating(recorder.pods[name]), "the busy pod was evicted"

            await stack.slurm.end_job(job)

            async def unprotected() -> bool:
                pod = recorder.pods.get(name)
                return pod is None or POD_PROTECT_LABEL not in (pod["metadata"].get("labels") or {})

            await until(unprotected, f"{name}'s protect label removed once the job ended")
            code, out, err = await kubectl(*drain, "--timeout=60s", check=False)
            assert code == 0, out + err

            async def evicted() -> bool:
                pod = recorder.pods.get(name)
                return pod is None or pod["metadata"]["uid"] != uid or terminating(pod)

            await until(evicted, f"{name} evicted")
            recorder.assert_quiescent()
        finally:
            if node:
                await kubectl("uncordon", node, check=False)
            await remove_nodeset(stack, recorder, "guard")

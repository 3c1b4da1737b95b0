"""The simulated Job controller and kubelet, through the real HTTP API, for what Skyhook's
stage Jobs rely on: podFailurePolicy on pod conditions (FailJob, Ignore, Count), suspend,
podReplacementPolicy, deadlines on a hung stage, OOMKilled, pods/log -- and the evidence that
podFailurePolicy cannot end a Job whose image never pulls."""

from __future__ import annotations

import asyncio
import os
import shutil
from typing import Any

import pytest
from kubernetes_asyncio import client

from clustersim.runner import Simulator
from tests.integration.clustersim.test_sim_workloads import condition, eventually, job_body

NS = "default"


async def finished(batch: client.BatchV1Api, name: str, kind: str, timeout: float = 10) -> Any:
    async def check() -> Any:
        job = await batch.read_namespaced_job_status(name, NS)
        found = condition(job, kind)
        return job if found and found.status == "True" else None

    return await eventually(check, timeout=timeout)


async def job_pods(core: client.CoreV1Api, name: str) -> list[Any]:
    pods = await core.list_namespaced_pod(NS, label_selector=f"job-name={name}")
    return list(pods.items)


async def running_pod(core: client.CoreV1Api, name: str) -> Any:
    async def check() -> Any:
        for pod in await job_pods(core, name):
            if pod.status.phase == "Running":
                return pod
        return None

    return await eventually(check)


@pytest.mark.parametrize(
    ("action", "outcome", "reason"),
    [
        ("FailJob", "Failed", "PodFailurePolicy"),
        ("Count", "Failed", "BackoffLimitExceeded"),
        ("Ignore", "", ""),
    ],
)
async def test_pod_failure_policy_on_pod_conditions_fail_count_or_ignore(
    sim: Simulator, action: str, outcome: str, reason: str
) -> None:
    """A pod whose node disappears fails with DisruptionTarget; the rule decides what that is."""
    policy = {"rules": [{"action": action, "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    body = job_body("disrupted", "busybox:sleep", backoffLimit=0, podFailurePolicy=policy)
    async with sim.api_client() as api:
        batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
        await batch.create_namespaced_job(NS, body)
        pod = await running_pod(core, "disrupted")
        await core.delete_node(pod.spec.node_name)
        if action == "Ignore":

            async def replaced() -> Any:
                pods = await job_pods(core, "disrupted")
                return [p for p in pods if p.metadata.uid != pod.metadata.uid]

            await eventually(replaced)
            job = await batch.read_namespaced_job_status("disrupted", NS)
            assert not job.status.failed  # ignored: not counted against backoffLimit 0
            assert condition(job, "Failed") is None
            return
        job = await finished(batch, "disrupted", outcome)
        assert condition(job, outcome).reason == reason
        assert job.status.failed == 1


async def test_suspended_job_runs_no_pod_until_resumed(sim: Simulator) -> None:
    async with sim.api_client() as api:
        batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
        await batch.create_namespaced_job(NS, job_body("held", suspend=True))

        async def suspended() -> Any:
            job = await batch.read_namespaced_job_status("held", NS)
            found = condition(job, "Suspended")
            return job if found and found.status == "True" else None

        job = await eventually(suspended)
        assert job.status.start_time is None
        assert await job_pods(core, "held") == []
        await batch.patch_namespaced_job("held", NS, {"spec": {"suspend": False}})
        job = await finished(batch, "held", "Complete")
        assert condition(job, "Suspended").status == "False"
        assert condition(job, "Suspended").reason == "JobResumed"


async def test_pod_replacement_policy_failed_waits_for_the_old_pod_to_end(sim: Simulator) -> None:
    body = job_body("replace", "busybox:sleep", backoffLimit=3, podReplacementPolicy="Failed")
    body["spec"]["template"]["metadata"] = {
        "annotations": {"clustersim.nodeflow.dev/stop-seconds": "3600"}
    }
    body["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 2
    async with sim.api_client() as api:
        batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
        await batch.create_namespaced_job(NS, body)
        first = await running_pod(core, "replace")
        await core.delete_namespaced_pod(first.metadata.name, NS)

        async def terminating() -> Any:
            job = await batch.read_namespaced_job_status("replace", NS)
            return job if job.status.terminating == 1 else None

        await eventually(terminating)
        # While the old pod terminates no second pod races it for the node.
        assert [p.metadata.uid for p in await job_pods(core, "replace")] == [first.metadata.uid]

        async def replaced() -> Any:
            pods = await job_pods(core, "replace")
            return [p for p in pods if p.metadata.uid != first.metadata.uid]

        await eventually(replaced, timeout=15)


async def test_a_hung_stage_fails_deadline_exceeded(sim: Simulator) -> None:
    body = job_body("hung", "registry/pkg:1.0.0-sleep", backoffLimit=0, activeDeadlineSeconds=1)
    body["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 0
    async with sim.api_client() as api:
        batch = client.BatchV1Api(api)
        await batch.create_namespaced_job(NS, body)
        job = await finished(batch, "hung", "Failed")
        assert condition(job, "Failed").reason == "DeadlineExceeded"
        assert condition(job, "FailureTarget").reason == "DeadlineExceeded"


async def test_oom_stage_fails_and_its_pod_says_oomkilled(sim: Simulator) -> None:
    async with sim.api_client() as api:
        batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
        await batch.create_namespaced_job(
            NS, job_body("oomy", "registry/pkg:2.0.0-oom", backoffLimit=0)
        )
        job = await finished(batch, "oomy", "Failed")
        assert condition(job, "Failed").reason == "BackoffLimitExceeded"
        (pod,) = await job_pods(core, "oomy")
        assert pod.status.container_statuses[0].state.terminated.reason == "OOMKilled"


async def test_pod_failure_policy_cannot_fail_a_job_whose_image_never_pulls(
    sim: Simulator,
) -> None:
    """Evidence for the proposal's question: ImagePullBackOff is a container waiting reason on
    a Pending pod. podFailurePolicy rules are only applied to pods that reached phase Failed,
    so even a rule matching a condition such a pod has (ContainersReady=False) never fires,
    and the Job stays active: the controller must fail it itself."""
    policy = {
        "rules": [
            {
                "action": "FailJob",
                "onPodConditions": [{"type": "ContainersReady", "status": "False"}],
            },
            {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [0]}},
        ]
    }
    body = job_body("nopull", "registry/pkg:1.0.0-unpullable", backoffLimit=0)
    body["spec"]["podFailurePolicy"] = policy
    async with sim.api_client() as api:
        batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
        await batch.create_namespaced_job(NS, body)

        async def backing_off() -> Any:
            for pod in await job_pods(core, "nopull"):
                for status in pod.status.container_statuses or []:
                    waiting = status.state.waiting
                    if waiting and waiting.reason == "ImagePullBackOff":
                        return pod
            return None

        pod = await eventually(backing_off)
        assert pod.status.phase == "Pending"
        assert condition(pod, "ContainersReady").status == "False"
        job = await batch.read_namespaced_job_status("nopull", NS)
        assert job.status.active == 1
        assert condition(job, "FailureTarget") is None
        assert condition(job, "Failed") is None
        # What the controller does instead: a deadline ends the Job, and the pod that never
        # ran counts as failed, never as succeeded.
        await batch.patch_namespaced_job("nopull", NS, {"spec": {"activeDeadlineSeconds": 1}})
        failed = await finished(batch, "nopull", "Failed")
        assert condition(failed, "Failed").reason == "DeadlineExceeded"
        assert not failed.status.succeeded
        assert failed.status.failed == 1


async def test_pods_log_shows_the_stage_output(sim: Simulator) -> None:
    body = job_body("logged")
    body["spec"]["template"]["spec"]["containers"][0]["args"] = ["apply"]
    body["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "SKYHOOK_STAGE", "value": "apply"}
    ]
    async with sim.api_client() as api:
        batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
        await batch.create_namespaced_job(NS, body)
        await finished(batch, "logged", "Complete")
        (pod,) = await job_pods(core, "logged")
        text = await core.read_namespaced_pod_log(pod.metadata.name, NS)
        assert f"busybox started on {pod.spec.node_name}: apply" in text
        assert "SKYHOOK_STAGE=apply" in text
        assert "exited with code 0 (Completed)" in text


async def run_kubectl(sim: Simulator, *args: str) -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if os.environ.get("CI") == "true":
            raise AssertionError("kubectl is required under CI")
        pytest.skip("kubectl not installed")
    proc = await asyncio.create_subprocess_exec(
        kubectl,
        f"--kubeconfig={sim.kubeconfig_path}",
        f"--namespace={NS}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "KUBECACHEDIR": str(sim.kubeconfig_path.parent / "kubectl-cache")},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {err.decode()}{out.decode()}"
    return out.decode()


async def test_kubectl_logs_and_describe_job_show_the_stage(sim: Simulator) -> None:
    body = job_body("stage")
    body["spec"]["template"]["spec"]["containers"][0]["args"] = ["config"]
    async with sim.api_client() as api:
        batch = client.BatchV1Api(api)
        await batch.create_namespaced_job(NS, body)
        await finished(batch, "stage", "Complete")
    logs = await run_kubectl(sim, "logs", "job/stage")
    assert "busybox started on" in logs and ": config" in logs
    described = await run_kubectl(sim, "describe", "job", "stage")
    assert "1 Succeeded" in described
    assert "Complete" in described

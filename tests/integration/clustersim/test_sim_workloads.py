"""Pods and Jobs through the real HTTP API with kubernetes-asyncio."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from clustersim.cluster.podlife import STOP_ANNOTATION
from clustersim.runner import Simulator

T = TypeVar("T")
NS = "default"


async def eventually(check: Callable[[], Awaitable[T | None]], timeout: float = 5.0) -> T:
    """Poll an async check until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout}s (last: {value!r})")
        await asyncio.sleep(0.05)


def pod_body(name: str, image: str = "busybox", **spec: Any) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": image}], **spec},
    }


def job_body(name: str, image: str = "busybox", **spec: Any) -> Any:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": image}],
                }
            },
            **spec,
        },
    }


def condition(obj: Any, kind: str) -> Any:
    for item in obj.status.conditions or []:
        if item.type == kind:
            return item
    return None


async def test_pod_goes_running_and_ready(sim: Simulator) -> None:
    async with sim.api_client() as api:
        core = client.CoreV1Api(api)
        await core.create_namespaced_pod(NS, pod_body("web"))

        async def ready() -> Any:
            pod = await core.read_namespaced_pod("web", NS)
            ready_condition = condition(pod, "Ready")
            return pod if ready_condition and ready_condition.status == "True" else None

        pod = await eventually(ready)
        assert pod.status.phase == "Running"
        assert pod.spec.node_name in sim.node_names()
        assert pod.status.pod_ip and pod.status.host_ip.startswith("10.174.")
        assert pod.status.start_time is not None
        assert {c.type for c in pod.status.conditions} >= {
            "PodScheduled",
            "Initialized",
            "ContainersReady",
            "Ready",
        }
        assert pod.status.container_statuses[0].state.running is not None


async def test_job_completes(sim: Simulator) -> None:
    async with sim.api_client() as api:
        batch = client.BatchV1Api(api)
        await batch.create_namespaced_job(NS, job_body("ok"))

        async def complete() -> Any:
            job = await batch.read_namespaced_job_status("ok", NS)
            done = condition(job, "Complete")
            return job if done and done.status == "True" else None

        job = await eventually(complete)
        assert job.status.succeeded == 1 and not job.status.failed
        assert job.status.start_time and job.status.completion_time
        assert condition(job, "SuccessCriteriaMet").status == "True"
        pods = await client.CoreV1Api(api).list_namespaced_pod(NS, label_selector="job-name=ok")
        assert [p.status.phase for p in pods.items] == ["Succeeded"]
        assert pods.items[0].metadata.owner_references[0].kind == "Job"
        assert not pods.items[0].metadata.finalizers  # tracking finalizer released


async def test_job_backs_off_then_fails(sim: Simulator) -> None:
    async with sim.api_client() as api:
        batch = client.BatchV1Api(api)
        await batch.create_namespaced_job(NS, job_body("flaky", "busybox:fail", backoffLimit=2))

        async def failed() -> Any:
            job = await batch.read_namespaced_job_status("flaky", NS)
            done = condition(job, "Failed")
            return job if done and done.status == "True" else None

        job = await eventually(failed)
        assert job.status.failed == 3
        assert condition(job, "Failed").reason == "BackoffLimitExceeded"
        assert condition(job, "FailureTarget").status == "True"
        pods = await client.CoreV1Api(api).list_namespaced_pod(NS, label_selector="job-name=flaky")
        assert len(pods.items) == 3
        exit_codes = {p.status.container_statuses[0].state.terminated.exit_code for p in pods.items}
        assert exit_codes == {1}


async def test_pod_failure_policy_fails_job_on_oom(sim: Simulator) -> None:
    policy = {
        "rules": [
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [137]}},
        ]
    }
    async with sim.api_client() as api:
        batch = client.BatchV1Api(api)
        await batch.create_namespaced_job(
            NS, job_body("oom", "busybox:oom", backoffLimit=5, podFailurePolicy=policy)
        )

        async def failed() -> Any:
            job = await batch.read_namespaced_job_status("oom", NS)
            done = condition(job, "Failed")
            return job if done and done.status == "True" else None

        job = await eventually(failed)
        assert condition(job, "Failed").reason == "PodFailurePolicy"
        assert job.status.failed == 1
        pods = await client.CoreV1Api(api).list_namespaced_pod(NS, label_selector="job-name=oom")
        terminated = pods.items[0].status.container_statuses[0].state.terminated
        assert (terminated.exit_code, terminated.reason) == (137, "OOMKilled")


async def test_active_deadline_and_ttl(sim: Simulator) -> None:
    async with sim.api_client() as api:
        batch = client.BatchV1Api(api)
        body = job_body("slow", activeDeadlineSeconds=1, ttlSecondsAfterFinished=1)
        body["spec"]["template"]["metadata"] = {
            "annotations": {"clustersim.nodeflow.dev/runtime-seconds": "60"}
        }
        # Failed is only set once the killed pod is gone (Kubernetes 1.31+ semantics).
        body["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 0
        await batch.create_namespaced_job(NS, body)

        async def failed() -> Any:
            job = await batch.read_namespaced_job_status("slow", NS)
            done = condition(job, "Failed")
            return job if done and done.status == "True" else None

        job = await eventually(failed, timeout=6)
        assert condition(job, "Failed").reason == "DeadlineExceeded"

        async def gone() -> bool:
            try:
                await batch.read_namespaced_job("slow", NS)
            except ApiException as exc:
                return exc.status == 404
            return False

        await eventually(gone, timeout=5)


async def test_a_pod_that_ignores_sigterm_is_removed_when_its_grace_ends(sim: Simulator) -> None:
    async with sim.api_client() as api:
        core = client.CoreV1Api(api)
        body = pod_body("stubborn")
        body["metadata"]["annotations"] = {STOP_ANNOTATION: "3600"}
        await core.create_namespaced_pod(NS, body)

        async def running() -> bool:
            pod = await core.read_namespaced_pod("stubborn", NS)
            return pod.status.phase == "Running"

        await eventually(running)
        started = time.monotonic()
        await core.delete_namespaced_pod("stubborn", NS, grace_period_seconds=1)
        pod = await core.read_namespaced_pod("stubborn", NS)
        assert pod.metadata.deletion_timestamp is not None

        async def gone() -> bool:
            try:
                await core.read_namespaced_pod("stubborn", NS)
            except ApiException as exc:
                return exc.status == 404
            return False

        await eventually(gone)
        assert time.monotonic() - started >= 0.9  # it was not removed before its grace


async def test_a_deleted_pod_whose_containers_exit_on_sigterm_goes_before_its_grace(
    sim: Simulator,
) -> None:
    """A real kubelet removes the pod once its containers exit (slurmd exits on SIGTERM);
    the grace period is only the bound. Here: a one-hour grace, gone within seconds."""
    async with sim.api_client() as api:
        core = client.CoreV1Api(api)
        await core.create_namespaced_pod(NS, pod_body("prompt"))

        async def running() -> bool:
            pod = await core.read_namespaced_pod("prompt", NS)
            return pod.status.phase == "Running"

        await eventually(running)
        await core.delete_namespaced_pod("prompt", NS, grace_period_seconds=3600)

        async def gone() -> bool:
            try:
                await core.read_namespaced_pod("prompt", NS)
            except ApiException as exc:
                return exc.status == 404
            return False

        await eventually(gone, timeout=60)


async def test_unpullable_image_stays_waiting(sim: Simulator) -> None:
    async with sim.api_client() as api:
        core = client.CoreV1Api(api)
        await core.create_namespaced_pod(NS, pod_body("nopull", "registry/app:unpullable"))
        reasons: set[str] = set()

        async def backoff() -> bool:
            pod = await core.read_namespaced_pod("nopull", NS)
            for status in pod.status.container_statuses or []:
                if status.state.waiting is not None:
                    reasons.add(status.state.waiting.reason)
            return "ImagePullBackOff" in reasons

        await eventually(backoff)
        assert "ErrImagePull" in reasons
        await asyncio.sleep(0.3)
        pod = await core.read_namespaced_pod("nopull", NS)
        assert pod.status.phase == "Pending"
        assert pod.status.container_statuses[0].state.waiting.reason == "ImagePullBackOff"


async def test_unschedulable_and_foreign_scheduler_pods_stay_pending(sim: Simulator) -> None:
    async with sim.api_client() as api:
        core = client.CoreV1Api(api)
        greedy = pod_body("greedy")
        greedy["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "9"}}
        await core.create_namespaced_pod(NS, greedy)
        await core.create_namespaced_pod(NS, pod_body("other", schedulerName="topology-placer"))

        async def marked() -> Any:
            pod = await core.read_namespaced_pod("greedy", NS)
            scheduled = condition(pod, "PodScheduled")
            return scheduled if scheduled and scheduled.status == "False" else None

        scheduled = await eventually(marked)
        assert scheduled.reason == "Unschedulable"
        assert scheduled.message == "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
        other = await core.read_namespaced_pod("other", NS)
        assert other.spec.node_name is None and other.status.phase == "Pending"
        assert condition(other, "PodScheduled") is None


async def test_node_affinity_and_taints_respected(sim: Simulator) -> None:
    target = sim.node_names()[2]
    for name in sim.node_names():
        if name != target:
            sim.cordon_node(name)
    async with sim.api_client() as api:
        core = client.CoreV1Api(api)
        body = pod_body("pinned")
        body["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [target],
                                }
                            ]
                        }
                    ]
                }
            }
        }
        await core.create_namespaced_pod(NS, body)
        await core.create_namespaced_pod(NS, pod_body("elsewhere", nodeSelector={"no": "such"}))

        async def bound() -> Any:
            pod = await core.read_namespaced_pod("pinned", NS)
            return pod.spec.node_name

        assert await eventually(bound) == target
        await asyncio.sleep(0.2)
        elsewhere = await core.read_namespaced_pod("elsewhere", NS)
        assert elsewhere.spec.node_name is None


async def test_the_install_namespace_exists_as_after_kubectl_apply(sim: Simulator) -> None:
    """maintenance-scheduler reads its MaintenanceOperatorConfig from nodeflow-system."""
    async with sim.api_client() as api:
        namespace = await client.CoreV1Api(api).read_namespace("nodeflow-system")
        assert namespace.status.phase == "Active"

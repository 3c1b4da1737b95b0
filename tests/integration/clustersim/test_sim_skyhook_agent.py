"""The simulated kubelet runs the Skyhook package pod contract: the Job pods the Skyhook
controller makes (`build_job`), their init containers in order, the agent judged by its
image and arguments, the copy dir kept on the node's host."""

from __future__ import annotations

import copy
from typing import Any

from kubernetes_asyncio import client

from clustersim.runner import Simulator
from maintenance_scheduler.skyhook.api import parse_skyhook
from maintenance_scheduler.skyhook.jobs import build_job
from tests.integration.clustersim.test_sim_workloads import NS, condition, eventually

COPY_DIR = "/var/lib/skyhook/gpu-init/driver-1.0.0-uid-1-1"


def stage_job(name: str, node: str, stage: str, image: str = "registry.local/driver") -> Any:
    skyhook = parse_skyhook(
        {
            "metadata": {"name": "gpu-init", "uid": "uid-1", "generation": 1},
            "spec": {"packages": {"driver": {"version": "1.0.0", "image": image}}},
        }
    )
    body = build_job(
        skyhook, skyhook.packages[0], stage, node, namespace=NS, default_stage_timeout_seconds=0
    )
    body["metadata"]["name"] = name
    del body["metadata"]["ownerReferences"]  # no such Skyhook here for the garbage collector
    return body


async def finished(batch: Any, name: str) -> Any:
    job = await batch.read_namespaced_job_status(name, NS)
    for kind in ("Complete", "Failed"):
        found = condition(job, kind)
        if found is not None and found.status == "True":
            return kind
    return None


async def pod_of(core: Any, job: str) -> Any:
    pods = await core.list_namespaced_pod(NS, label_selector=f"batch.kubernetes.io/job-name={job}")
    return pods.items[0]


def ends(pod: Any) -> list[tuple[str, int | None]]:
    out: list[tuple[str, int | None]] = []
    for status in pod.status.init_container_statuses or []:
        terminated = status.state.terminated
        out.append((status.name, terminated.exit_code if terminated else None))
    return out


async def test_rule_a_package_pod_runs_copy_then_stage_then_check_with_the_copy_dir(
    sim: Simulator,
) -> None:
    node = sim.node_names()[0]
    async with sim.api_client() as api:
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        await batch.create_namespaced_job(NS, stage_job("apply", node, "apply"))
        assert await eventually(lambda: finished(batch, "apply"), timeout=15) == "Complete"
        pod = await pod_of(core, "apply")
        assert ends(pod) == [("driver-init", 0), ("driver-apply", 0), ("driver-applycheck", 0)]
        by_name = {c.name: c for c in pod.spec.init_containers}
        assert by_name["driver-apply"].args == ["apply", "/root", COPY_DIR]
        assert by_name["driver-applycheck"].args == ["apply-check", "/root", COPY_DIR]
        assert pod.status.container_statuses[0].state.terminated.exit_code == 0  # done


async def test_rule_an_agent_stage_without_its_copy_dir_on_the_host_fails(sim: Simulator) -> None:
    first, second = sim.node_names()[:2]
    async with sim.api_client() as api:
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        # The agent alone (no copy container): on a node where nothing copied the package
        # it stops at its argument check; where an earlier pod copied it, it runs.
        await batch.create_namespaced_job(NS, stage_job("copied", first, "apply"))
        assert await eventually(lambda: finished(batch, "copied"), timeout=15) == "Complete"
        for name, node in (("agent-here", first), ("agent-there", second)):
            body = stage_job(name, node, "config")
            spec = body["spec"]["template"]["spec"]
            spec["initContainers"] = spec["initContainers"][1:]
            await batch.create_namespaced_job(NS, body)
        assert await eventually(lambda: finished(batch, "agent-here"), timeout=15) == "Complete"
        assert await eventually(lambda: finished(batch, "agent-there"), timeout=15) == "Failed"
        pod = await pod_of(core, "agent-there")
        assert ends(pod) == [("driver-config", 2), ("driver-configcheck", None)]
        message = pod.status.init_container_statuses[0].state.terminated.message
        assert COPY_DIR in message


async def test_rule_the_old_stage_only_contract_does_not_run(sim: Simulator) -> None:
    """A container given only `[stage]` (the contract before the agent) is refused."""
    node = sim.node_names()[2]
    async with sim.api_client() as api:
        batch = client.BatchV1Api(api)
        body = stage_job("bare", node, "apply")
        spec = body["spec"]["template"]["spec"]
        agent = copy.deepcopy(spec["initContainers"][1])
        agent["args"] = ["apply"]
        spec["initContainers"] = [spec["initContainers"][0], agent]
        await batch.create_namespaced_job(NS, body)
        assert await eventually(lambda: finished(batch, "bare"), timeout=15) == "Failed"


async def test_rule_a_failing_package_fails_its_stage_container(sim: Simulator) -> None:
    node = sim.node_names()[3]
    async with sim.api_client() as api:
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        body = stage_job("broken", node, "apply", image="registry.local/driver")
        init = body["spec"]["template"]["spec"]["initContainers"][0]
        init["image"] = "registry.local/driver:1.0.0-fail"
        await batch.create_namespaced_job(NS, body)
        assert await eventually(lambda: finished(batch, "broken"), timeout=15) == "Failed"
        pod = await pod_of(core, "broken")
        assert ends(pod) == [("driver-init", 0), ("driver-apply", 1), ("driver-applycheck", None)]
        assert pod.status.phase == "Failed"


def interrupt_job(name: str, node: str, kind: str) -> Any:
    skyhook = parse_skyhook(
        {
            "metadata": {"name": "gpu-init", "uid": "uid-1", "generation": 1},
            "spec": {
                "packages": {
                    "driver": {
                        "version": "1.0.0",
                        "image": "registry.local/driver",
                        "interrupt": {"type": kind, "services": ["a.service"]},
                    }
                }
            },
        }
    )
    body = build_job(
        skyhook,
        skyhook.packages[0],
        "interrupt",
        node,
        namespace=NS,
        default_stage_timeout_seconds=0,
    )
    body["metadata"]["name"] = name
    del body["metadata"]["ownerReferences"]
    return body


async def test_a_long_running_pod_with_init_containers_runs_once_they_are_done(
    sim: Simulator,
) -> None:
    """Only a failing init container holds a pod Pending: a service whose init containers
    succeed runs and is Ready, its init containers Completed."""
    node = sim.node_names()[0]
    async with sim.api_client() as api:
        core = client.CoreV1Api(api)
        body: Any = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "served"},
            "spec": {
                "nodeName": node,
                "initContainers": [{"name": "setup", "image": "busybox"}],
                "containers": [{"name": "main", "image": "busybox"}],
            },
        }
        await core.create_namespaced_pod(NS, body)

        async def ready() -> Any:
            pod = await core.read_namespaced_pod("served", NS)
            ok = pod.status.phase == "Running" and condition(pod, "Ready").status == "True"
            return pod if ok else None

        pod = await eventually(ready, timeout=15)
        assert ends(pod) == [("setup", 0)]

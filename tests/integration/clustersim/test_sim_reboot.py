"""A pod running the reboot interrupt reboots its node in the simulator: Ready=False for a
while, a new boot ID, and the node's pods restarted as a kubelet restarts them."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from clustersim.runner import Simulator
from tests.integration.clustersim.test_sim_skyhook_agent import interrupt_job
from tests.integration.clustersim.test_sim_workloads import (
    NS,
    condition,
    eventually,
    pod_body,
)


def boot_id(node: Any) -> str:
    return str(node.status.node_info.boot_id)


async def test_reboot_interrupt_pod_reboots_its_node_with_a_new_boot_id(sim: Simulator) -> None:
    node_name = sim.node_names()[0]
    readiness: list[str] = []

    def record(resource: str, event: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if resource == "nodes" and obj["metadata"]["name"] == node_name:
            for item in (obj.get("status") or {}).get("conditions") or []:
                if item["type"] == "Ready" and (not readiness or readiness[-1] != item["status"]):
                    readiness.append(item["status"])

    sim.store.add_listener(record)
    async with sim.api_client() as api:
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        before = boot_id(await core.read_node(node_name))
        await core.create_namespaced_pod(NS, pod_body("service", nodeName=node_name))
        await core.create_namespaced_pod(
            NS, pod_body("one-shot", "busybox:sleep", nodeName=node_name, restartPolicy="Never")
        )

        async def running(name: str) -> Any:
            pod = await core.read_namespaced_pod(name, NS)
            return pod if pod.status.phase == "Running" else None

        await eventually(lambda: running("service"))
        await eventually(lambda: running("one-shot"))
        # The Skyhook agent's reboot interrupt, as the Skyhook controller's Job runs it.
        await batch.create_namespaced_job(NS, interrupt_job("reboot", node_name, "reboot"))

        async def rebooted() -> Any:
            node = await core.read_node(node_name)
            ready = condition(node, "Ready")
            return node if ready.status == "True" and boot_id(node) != before else None

        node = await eventually(rebooted, timeout=30)
        assert readiness[-2:] == ["False", "True"]  # it went down on the way
        assert not any(t.key == "node.kubernetes.io/not-ready" for t in node.spec.taints or [])

        async def restarted() -> Any:
            pod = await core.read_namespaced_pod("service", NS)
            statuses = pod.status.container_statuses or []
            done = pod.status.phase == "Running" and statuses and statuses[0].restart_count == 1
            return pod if done and condition(pod, "Ready").status == "True" else None

        service = await eventually(restarted, timeout=30)
        last = service.status.container_statuses[0].last_state.terminated
        assert (last.reason, last.exit_code) == ("Unknown", 255)
        one_shot = await core.read_namespaced_pod("one-shot", NS)
        assert one_shot.status.phase == "Failed"  # restartPolicy Never: not started again
        job = await batch.read_namespaced_job_status("reboot", NS)
        assert condition(job, "Complete").status == "True"


async def test_only_the_reboot_interrupt_reboots_the_node(sim: Simulator) -> None:
    node_name = sim.node_names()[1]
    async with sim.api_client() as api:
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        before = boot_id(await core.read_node(node_name))
        await batch.create_namespaced_job(NS, interrupt_job("post", node_name, "service"))

        async def complete() -> Any:
            job = await batch.read_namespaced_job_status("post", NS)
            found = condition(job, "Complete")
            return job if found and found.status == "True" else None

        await eventually(complete, timeout=10)
        node = await core.read_node(node_name)
        assert boot_id(node) == before
        assert condition(node, "Ready").status == "True"

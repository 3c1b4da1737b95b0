"""Rule 4a on the whole stack as `make run` starts it, driven with kubectl and Slurm's REST API
(issue 32 item 1): a NodeSet pod whose Slurm node runs a job is not evicted by
`kubectl drain --disable-eviction=false` -- the NodeSet's PodDisruptionBudget refuses it and
drain gives up at its timeout -- and once the job has ended the same drain evicts it.
`workloadDisruptionProtection: false` then takes the budget and the labels away."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from nodeflow_contracts.pod_protocol import NODESET_LABEL, POD_PROTECT_LABEL
from tests.e2e import processes
from tests.e2e.chaos_support import NODESETS, NS, PODS, Stack, launched_stack, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOPOLOGY = "spines=1,blocks_per_spine=1,nodes_per_block=2"
BUDGET = f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/slurm-workers-pdb-guard"
REFUSED = "Cannot evict pod as it would violate the pod's disruption budget"


@pytest.fixture(autouse=True)
def require_kubectl() -> None:
    if processes.KUBECTL is None:
        pytest.skip("kubectl not installed (apt-get install kubernetes-client)")


def nodeset(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "nodeflow.dev/v1alpha1",
        "kind": "NodeSet",
        "metadata": {"name": "guard", "namespace": NS},
        "spec": {
            "replicas": replicas,
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
    }


async def kubectl(stack: Stack, *args: str) -> tuple[int, str]:
    """kubectl against the stack's simulator: its exit code and its output (both streams)."""
    assert processes.KUBECTL is not None
    kubeconfig = Path(stack.env["KUBECONFIG"])
    process = await asyncio.create_subprocess_exec(
        processes.KUBECTL,
        f"--kubeconfig={kubeconfig}",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "KUBECACHEDIR": str(kubeconfig.parent / "kubectl-cache")},
    )
    output, _ = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode is not None
    return process.returncode, output.decode(errors="replace")


async def drain(stack: Stack, node: str, timeout: str) -> tuple[int, str]:
    return await kubectl(
        stack,
        "drain",
        node,
        "--disable-eviction=false",
        f"--pod-selector={NODESET_LABEL}=guard",
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        f"--timeout={timeout}",
    )


async def live_pods(stack: Stack) -> list[dict[str, Any]]:
    pods = await stack.kube.items(f"{PODS}?labelSelector={NODESET_LABEL}%3Dguard")
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


async def exists(stack: Stack, path: str) -> bool:
    try:
        await stack.kube.call("GET", path)
    except RuntimeError as exc:
        if "HTTP 404" in str(exc):
            return False
        raise
    return True


async def test_rule_a_pod_running_a_slurm_job_is_not_evicted_by_kubectl_drain(
    tmp_path: Path,
) -> None:
    async with launched_stack(tmp_path / "run", 2, TOPOLOGY) as stack:
        await stack.kube.create(NODESETS, nodeset(1))

        async def idle_and_ready() -> bool:
            pods = await live_pods(stack)
            if len(pods) != 1:
                return False
            states = await stack.slurm.nodes()
            return "IDLE" in states.get(pods[0]["metadata"]["name"], [])

        await wait_until(idle_and_ready, 90, "the NodeSet pod registered idle in Slurm")
        (pod,) = await live_pods(stack)
        name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
        await wait_until(lambda: exists(stack, BUDGET), 30, "the NodeSet's budget made")
        budget = await stack.kube.call("GET", BUDGET)
        assert budget["spec"]["minAvailable"] == 2147483647
        assert "maxUnavailable" not in budget["spec"]
        assert budget["metadata"]["ownerReferences"][0]["kind"] == "NodeSet"

        job = await stack.slurm.run_job(name)

        async def protected() -> bool:
            pods = await live_pods(stack)
            return bool(pods) and pods[0]["metadata"]["labels"].get(POD_PROTECT_LABEL) == "true"

        await wait_until(protected, 30, "the busy pod labelled protected")
        code, output = await drain(stack, node, "6s")
        assert code != 0, output
        assert REFUSED in output, output
        (still,) = await live_pods(stack)
        assert still["metadata"]["uid"] == pod["metadata"]["uid"], "the pod was evicted"
        assert job in await stack.slurm.jobs(), "the job was ended"

        # The job ends (drain's cordon has drained the Slurm node meanwhile): the label goes,
        # and the same drain evicts the pod.
        await stack.slurm.end_job(job)

        async def unprotected() -> bool:
            pods = await live_pods(stack)
            return not pods or POD_PROTECT_LABEL not in pods[0]["metadata"]["labels"]

        await wait_until(unprotected, 30, "the idle pod's protect label removed")
        code, output = await drain(stack, node, "60s")
        assert code == 0, output
        assert "evicted" in output, output

        async def gone() -> bool:
            pods = await stack.kube.items(f"{PODS}?labelSelector={NODESET_LABEL}%3Dguard")
            return all(p["metadata"]["uid"] != pod["metadata"]["uid"] for p in pods)

        await wait_until(gone, 30, "the evicted pod gone")

        # workloadDisruptionProtection: false takes the budget away.
        await stack.kube.merge_patch(
            f"{NODESETS}/guard", {"spec": {"workloadDisruptionProtection": False}}
        )

        async def budget_gone() -> bool:
            return not await exists(stack, BUDGET)

        await wait_until(budget_gone, 30, "the budget deleted once protection is off")

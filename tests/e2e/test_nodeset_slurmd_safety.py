"""One slurmd per node and no slurmd killed on a stale word, on the whole stack as `make run`
starts it, driven through the Kubernetes API and Slurm's REST API (issue 28 items 1 and 2),
with the recorder of tests/e2e/chaos_support.py watching every NodeSet pod.

* A bound pod that is Pending (its sidecar's image does not pull) while its slurmd runs and
  is registered is deleted only once Slurm, read after its SlurmDelete, reports it drained.
  The simulator registers a slurmd only for a Ready pod, so the test registers it the way
  slurmd would, through the simulated slurmctld's admin API.
* A NodeSet scaled down and back up while its claim's release is still being retried never
  gets its pod beside a second NodeSet's on the node it gave up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodeflow_contracts.pod_protocol import SLURM_DELETE_CONDITION
from tests.e2e.chaos_support import (
    NODES,
    NODESETS,
    PODS,
    Stack,
    condition,
    is_true,
    launched_stack,
    recording,
    terminating,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOPOLOGY = "spines=1,blocks_per_spine=2,nodes_per_block=2"
SLURM_ADMIN = "/_sim/slurm"
KUBE_FAULTS = "/_sim/faults"


def nodeset(
    name: str, replicas: int, *, sidecar: str | None = None, pool: str | None = None
) -> dict[str, Any]:
    containers: list[dict[str, Any]] = [
        {"name": "slurmd", "image": "slurmd:24.11", "resources": {"requests": {"cpu": "1"}}}
    ]
    if sidecar is not None:
        containers.append({"name": "sidecar", "image": sidecar})
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 1, "containers": containers}
    if pool is not None:
        spec["nodeSelector"] = {"pool": pool}
    return {
        "apiVersion": "nodeflow.dev/v1alpha1",
        "kind": "NodeSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "slurmCluster": "sim",
            "template": {"metadata": {"labels": {"app": "slurmd"}}, "spec": spec},
        },
    }


async def slurm_admin(stack: Stack, method: str, path: str, body: Any = None) -> Any:
    """The simulated slurmctld's admin API (not subject to its REST faults)."""
    async with stack.session.request(
        method, stack.slurm.url + SLURM_ADMIN + path, json=body
    ) as reply:
        assert reply.status < 400, (method, path, reply.status, await reply.text())
        return await reply.json()


async def test_rule_a_bound_pending_pod_is_deleted_only_once_slurm_reports_it_drained(
    tmp_path: Path,
) -> None:
    async with (
        launched_stack(tmp_path / "run", 4, TOPOLOGY) as stack,
        recording(stack) as recorder,
    ):
        await stack.kube.create(NODESETS, nodeset("side", 1, sidecar="sidecar:1-unpullable"))

        async def bound_and_pending() -> bool:
            pods = recorder.live_pods("side")
            return (
                len(pods) == 1
                and bool(pods[0]["spec"].get("nodeName"))
                and (pods[0].get("status") or {}).get("phase") == "Pending"
            )

        await wait_until(bound_and_pending, 60, "the pod bound and Pending (sidecar unpullable)")
        name = recorder.live_pods("side")[0]["metadata"]["name"]
        # Its slurmd runs beside the sidecar and registers under the pod's name.
        await slurm_admin(stack, "POST", "/nodes", {"name": name, "cpus": 4, "real_memory": 16384})

        async def idle_in_kubernetes() -> bool:
            pods = recorder.live_pods("side")
            return bool(pods) and condition(pods[0], "SlurmNodeStateIdle") is not None

        await wait_until(idle_in_kubernetes, 30, "slurm-syncer reporting the Slurm node idle")
        # slurmrestd answers slowly from now on: a drain lands a while after it is asked for,
        # while slurm-syncer's view stays fresh (each poll is late by the same amount).
        await slurm_admin(stack, "POST", "/faults", {"latency": 1.5})
        await stack.kube.merge_patch(f"{NODESETS}/side", {"spec": {"replicas": 0}})

        async def marked() -> bool:
            pod = recorder.pods.get(name)
            return pod is None or is_true(pod, SLURM_DELETE_CONDITION)

        await wait_until(marked, 30, "the pod marked SlurmDelete")

        async def leaving() -> bool:
            pod = recorder.pods.get(name)
            return pod is None or terminating(pod)

        await wait_until(leaving, 60, "the pod deleted", interval=0.05)
        state = await slurm_admin(stack, "GET", "/state")
        # Deleted once drained: Pending proved nothing, and the idle read came before the
        # mark (a job could have started since).
        assert "DRAIN" in state["nodes"][name], state["nodes"][name]
        await slurm_admin(stack, "DELETE", "/faults")
        recorder.assert_no_violation()


async def test_rule_a_nodeset_scaled_down_and_up_fast_never_shares_its_node(
    tmp_path: Path,
) -> None:
    """`beta` gives up the one node of pool `shared` (scaled to 0) while `alpha` waits for it;
    the release of beta's claim is refused by the API server three times (retried for seconds)
    and beta is scaled back to 1 meanwhile. Beta's pod is not recreated on the claim being
    released: the node goes to alpha once free, and one NodeSet pod runs there at any time
    (the recorder would see two: beta's recreated pod beside alpha's)."""
    async with (
        launched_stack(tmp_path / "run", 4, TOPOLOGY) as stack,
        recording(stack) as recorder,
    ):
        kube = stack.kube
        shared = sorted(recorder.nodes)[0]
        await kube.merge_patch(f"{NODES}/{shared}", {"metadata": {"labels": {"pool": "shared"}}})
        await kube.create(NODESETS, nodeset("beta", 1, pool="shared"))

        async def beta_ready() -> bool:
            pods = recorder.live_pods("beta")
            return len(pods) == 1 and is_true(pods[0], "Ready")

        await wait_until(beta_ready, 60, "beta's pod Ready on the shared node")
        await kube.create(NODESETS, nodeset("alpha", 1, pool="shared"))
        beta_pod = recorder.live_pods("beta")[0]["metadata"]["name"]
        # Node patches (claims and releases) fail three times: the release is retried.
        await kube.call(
            "POST",
            KUBE_FAULTS,
            {"error_count": 3, "error_code": 500, "verbs": ["patch"], "resources": ["nodes"]},
        )
        await kube.merge_patch(f"{NODESETS}/beta", {"spec": {"replicas": 0}})

        async def beta_pod_gone() -> bool:
            return beta_pod not in recorder.pods

        await wait_until(beta_pod_gone, 60, "beta's pod deleted", interval=0.05)

        async def release_refused() -> bool:
            faults = await kube.call("GET", KUBE_FAULTS)
            return int(faults["error_count"]) < 3

        # The release was sent and refused once: it is retried (after a second, then two).
        await wait_until(release_refused, 30, "the release of beta's claim refused", 0.02)
        await kube.merge_patch(f"{NODESETS}/beta", {"spec": {"replicas": 1}})

        def nodeset_pods_on_shared() -> list[dict[str, Any]]:
            return [
                p
                for p in recorder.pods.values()
                if "nodeflow.dev/nodeset" in (p["metadata"].get("labels") or {})
                and (p.get("spec") or {}).get("nodeName") == shared
            ]

        async def settled() -> bool:
            """The release landed (the retries ran out of refusals) and the node went to the
            NodeSet whose claim was sent first once it was free (alpha's: NodeSets are
            planned in name order, and one node's commands are applied in order)."""
            pods = nodeset_pods_on_shared()
            if len(pods) != 1 or not is_true(pods[0], "Ready") or terminating(pods[0]):
                return False
            if recorder.live_pods("beta"):
                return False
            node = recorder.nodes.get(shared) or {}
            claim = (node["metadata"].get("annotations") or {}).get("nodeflow.dev/nodeset")
            owner = pods[0]["metadata"]["labels"]["nodeflow.dev/nodeset"]
            return claim == "default.alpha" and owner == "alpha"

        await wait_until(settled, 90, "the shared node alpha's, with alpha's pod alone")
        await kube.call("DELETE", KUBE_FAULTS)
        recorder.assert_no_violation()
        # The recorder holds the rule over NodeSets: a pod of the other NodeSet put there by
        # hand is caught.
        await kube.create(PODS, stray_pod("stray-beta", shared, "beta"))

        async def caught() -> bool:
            return any(v.rule == "two-pods-on-one-node" for v in recorder.violations)

        await wait_until(caught, 30, "the recorder catching two NodeSets on one node")
        recorder.violations.clear()


def stray_pod(name: str, node: str, nodeset_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"nodeflow.dev/nodeset": nodeset_name},
        },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "c:1"}],
        },
    }

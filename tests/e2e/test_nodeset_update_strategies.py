"""Rules 7b and 7c on the whole stack as `make run` starts it, driven with kubectl (issue 32
item 2): under `updateStrategy.type: OnDelete` a template change replaces no pod; the pod a
person deletes with `kubectl delete pod` comes back on its node from the new template, and the
other keeps running its old one. With `minReadySeconds` a rolling update waits until the
replaced pod has been Ready that long before it replaces the next."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from nodeflow_contracts.pod_protocol import NODESET_LABEL, REVISION_LABEL, SLURM_DELETE_CONDITION
from nodeflow_kube.fields import parse_time
from tests.e2e import processes
from tests.e2e.chaos_support import (
    NODESETS,
    NS,
    PODS,
    Stack,
    is_true,
    launched_stack,
    wait_until,
)
from tests.e2e.test_nodeset_eviction_protection import kubectl

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOPOLOGY = "spines=1,blocks_per_spine=1,nodes_per_block=2"
NAME = "ondelete"
OLD_IMAGE, NEW_IMAGE = "slurmd:24.11", "slurmd:25.05"


@pytest.fixture(autouse=True)
def require_kubectl() -> None:
    if processes.KUBECTL is None:
        pytest.skip("kubectl not installed (apt-get install kubernetes-client)")


def container(image: str) -> dict[str, Any]:
    return {"name": "slurmd", "image": image, "resources": {"requests": {"cpu": "1"}}}


def nodeset() -> dict[str, Any]:
    return {
        "apiVersion": "nodeflow.dev/v1alpha1",
        "kind": "NodeSet",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {
            "replicas": 2,
            "slurmCluster": "sim",
            "updateStrategy": {"type": "OnDelete"},
            "template": {
                "metadata": {"labels": {"app": "slurmd"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [container(OLD_IMAGE)],
                },
            },
        },
    }


async def live_pods(stack: Stack) -> dict[str, dict[str, Any]]:
    pods = await stack.kube.items(f"{PODS}?labelSelector={NODESET_LABEL}%3D{NAME}")
    return {p["metadata"]["name"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}


def image_of(pod: dict[str, Any]) -> str:
    return str(pod["spec"]["containers"][0]["image"])


def marked(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == SLURM_DELETE_CONDITION and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


async def test_rule_on_delete_replaces_only_the_pod_kubectl_deletes(tmp_path: Path) -> None:
    async with launched_stack(tmp_path / "run", 2, TOPOLOGY) as stack:
        await stack.kube.create(NODESETS, nodeset())

        async def both_idle() -> bool:
            pods = await live_pods(stack)
            if len(pods) != 2:
                return False
            states = await stack.slurm.nodes()
            return all("IDLE" in states.get(name, []) for name in pods)

        await wait_until(both_idle, 90, "both NodeSet pods registered idle in Slurm")
        before = await live_pods(stack)
        old_revision = {p["metadata"]["labels"][REVISION_LABEL] for p in before.values()}
        assert len(old_revision) == 1

        code, output = await kubectl(
            stack,
            "patch",
            f"nodesets.nodeflow.dev/{NAME}",
            f"--namespace={NS}",
            "--type=merge",
            "--patch="
            + json.dumps({"spec": {"template": {"spec": {"containers": [container(NEW_IMAGE)]}}}}),
        )
        assert code == 0, output
        obj = await stack.kube.call("GET", f"{NODESETS}/{NAME}")
        generation = int(obj["metadata"]["generation"])

        async def observed() -> bool:
            current = await stack.kube.call("GET", f"{NODESETS}/{NAME}")
            return (current.get("status") or {}).get("observedGeneration") == generation

        await wait_until(observed, 30, "the controller planned with the new template")
        status = (await stack.kube.call("GET", f"{NODESETS}/{NAME}"))["status"]
        assert status["updatedNumberScheduled"] == 0
        after = await live_pods(stack)
        assert {n: p["metadata"]["uid"] for n, p in after.items()} == {
            n: p["metadata"]["uid"] for n, p in before.items()
        }, "a pod was replaced for the template change"
        assert not any(marked(p) for p in after.values()), "a pod was marked for replacement"

        deleted, kept = sorted(before)
        code, output = await kubectl(
            stack, "delete", "pod", deleted, f"--namespace={NS}", "--wait=false"
        )
        assert code == 0, output

        async def replaced() -> bool:
            pods = await live_pods(stack)
            new = pods.get(deleted)
            return (
                new is not None
                and new["metadata"]["uid"] != before[deleted]["metadata"]["uid"]
                and new["spec"].get("nodeName") == before[deleted]["spec"]["nodeName"]
            )

        await wait_until(replaced, 60, "the deleted pod recreated on its node")
        pods = await live_pods(stack)
        assert image_of(pods[deleted]) == NEW_IMAGE
        assert pods[deleted]["metadata"]["labels"][REVISION_LABEL] not in old_revision
        assert pods[kept]["metadata"]["uid"] == before[kept]["metadata"]["uid"]
        assert image_of(pods[kept]) == OLD_IMAGE
        assert not marked(pods[kept])

        async def one_updated() -> bool:
            current = await stack.kube.call("GET", f"{NODESETS}/{NAME}")
            return (current.get("status") or {}).get("updatedNumberScheduled") == 1

        await wait_until(one_updated, 30, "updatedNumberScheduled counts the recreated pod")


MIN_READY = 8


def condition_since(pod: dict[str, Any], kind: str) -> float:
    for entry in (pod.get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind and entry.get("status") == "True":
            since = parse_time(entry.get("lastTransitionTime"))
            assert since is not None, entry
            return since
    raise AssertionError(f"{pod['metadata']['name']} has no {kind}=True")


async def test_rule_min_ready_seconds_holds_the_rollout_until_the_new_pod_is_available(
    tmp_path: Path,
) -> None:
    """maxUnavailable 1, minReadySeconds 8: the second pod is marked for replacement only once
    the first one's replacement has been Ready for 8 s -- read from the objects' own
    timestamps (the Ready condition's, the SlurmDelete condition's; whole seconds, so a
    second of slack), not from the test's clock."""
    async with launched_stack(tmp_path / "run", 2, TOPOLOGY) as stack:
        obj = nodeset()
        rolling = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
        obj["spec"]["updateStrategy"] = rolling
        obj["spec"]["minReadySeconds"] = MIN_READY
        await stack.kube.create(NODESETS, obj)

        async def both_ready() -> bool:
            pods = await live_pods(stack)
            return len(pods) == 2 and all(is_true(p, "Ready") for p in pods.values())

        await wait_until(both_ready, 90, "both NodeSet pods Ready")

        async def both_available() -> bool:
            # Ready for minReadySeconds: until then the status counts them unavailable (and a
            # rollout would replace them as such, as a DaemonSet does).
            status = (await stack.kube.call("GET", f"{NODESETS}/{NAME}")).get("status") or {}
            return status.get("numberReady") == 2 and status.get("numberUnavailable") == 0

        await wait_until(both_available, 60, "both NodeSet pods available")
        before = await live_pods(stack)
        for pod in before.values():
            assert time.time() >= condition_since(pod, "Ready") + MIN_READY - 1
        code, output = await kubectl(
            stack,
            "patch",
            f"nodesets.nodeflow.dev/{NAME}",
            f"--namespace={NS}",
            "--type=merge",
            "--patch="
            + json.dumps({"spec": {"template": {"spec": {"containers": [container(NEW_IMAGE)]}}}}),
        )
        assert code == 0, output

        async def one_replaced_and_other_marked() -> bool:
            pods = await live_pods(stack)
            renewed = [
                n for n, p in pods.items() if p["metadata"]["uid"] != before[n]["metadata"]["uid"]
            ]
            return len(renewed) == 1 and any(marked(p) for n, p in pods.items() if n not in renewed)

        await wait_until(one_replaced_and_other_marked, 120, "the second pod marked")
        pods = await live_pods(stack)
        (first,) = [
            p for n, p in pods.items() if p["metadata"]["uid"] != before[n]["metadata"]["uid"]
        ]
        (second,) = [p for p in pods.values() if p is not first]
        assert image_of(first) == NEW_IMAGE
        ready_at = condition_since(first, "Ready")
        marked_at = condition_since(second, SLURM_DELETE_CONDITION)
        assert marked_at >= ready_at + MIN_READY - 1, (ready_at, marked_at)

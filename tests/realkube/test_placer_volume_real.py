"""topology-placer's WaitForFirstConsumer claims on the real control plane (rule 3a): a gang of
two whose members each name a claim of a class that binds on first consumer, with a provisioner
(none runs here: the claims stay Pending, as they would until the provisioner has made the
volume). The placer writes `volume.kubernetes.io/selected-node` on each claim through
k8s-watcher, with the RBAC we ship, and binds each member to its claim's node once the
annotations are seen, both in one block; the real PV controller leaves the annotation alone. A
claim of a class without a provisioner (pre-made local volumes) is not bound by the placer:
its pod waits and says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.chaos_support import recording
from tests.e2e.test_chaos_gang import BLOCK, member, pod_group, topology
from tests.realkube.stack import real_stack
from tests.realkube.support import STEP_TIMEOUT, kubectl, until
from tests.realkube.test_placer_gangs_real import bound, remove_gangs
from topology_placer.volumes import SELECTED_NODE_ANNOTATION

pytestmark = [pytest.mark.real_kube, pytest.mark.timeout(900)]

WAIT = STEP_TIMEOUT * 3
PROVISIONED = "nodeflow-test-wffc"
LOCAL = "nodeflow-test-local"


def storage_class(name: str, provisioner: str) -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": provisioner,
        "volumeBindingMode": "WaitForFirstConsumer",
    }


def claim(name: str, storage_class_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "storageClassName": storage_class_name,
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def with_claim(pod: dict[str, Any], claim_name: str) -> dict[str, Any]:
    pod["spec"]["volumes"] = [
        {"name": "scratch", "persistentVolumeClaim": {"claimName": claim_name}}
    ]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
    return pod


async def claims() -> dict[str, dict[str, Any]]:
    _, out, _ = await kubectl("get", "pvc", "-n", "default", "-o", "json")
    return {c["metadata"]["name"]: c for c in json.loads(out)["items"]}


async def test_rule_wait_for_first_consumer_claims_get_their_node_then_the_gang_is_bound(
    tmp_path: Path,
) -> None:
    async with real_stack(tmp_path) as stack, recording(stack) as recorder:
        try:
            members = [with_claim(member("vol", rank), f"vol-{rank}") for rank in range(2)]
            group = pod_group("vol", 2)
            docs = [
                storage_class(PROVISIONED, "example.com/nodeflow-test"),
                topology(),
                claim("vol-0", PROVISIONED),
                claim("vol-1", PROVISIONED),
                group,
                *members,
            ]
            await kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))

            async def both_bound() -> dict[str, str] | None:
                placed = bound(recorder, "vol")
                return placed if len(placed) == 2 else None

            placed: dict[str, str] = await until(both_bound, "both members bound", WAIT)
            found = await claims()
            for rank in range(2):
                annotations = found[f"vol-{rank}"]["metadata"].get("annotations") or {}
                assert annotations.get(SELECTED_NODE_ANNOTATION) == placed[f"vol-{rank}"]
                # No provisioner runs: the claim waits for its volume, bound to no node yet.
                assert found[f"vol-{rank}"]["status"].get("phase") == "Pending"
            blocks = {recorder.nodes[n]["metadata"]["labels"][BLOCK] for n in placed.values()}
            assert len(blocks) == 1
            recorder.assert_quiescent()
        finally:
            await remove_gangs(recorder, "vol")
            await kubectl("delete", "pvc", "vol-0", "vol-1", "--ignore-not-found", "--wait=false")
            await kubectl(
                "delete", "storageclass", PROVISIONED, "--ignore-not-found", "--wait=false"
            )
            await kubectl(
                "delete",
                "clusternetworktopologies.scheduling.koordinator.sh/default",
                "--ignore-not-found",
                "--wait=false",
            )


async def test_rule_a_claim_of_a_class_without_a_provisioner_leaves_its_pod_waiting(
    tmp_path: Path,
) -> None:
    async with real_stack(tmp_path) as stack, recording(stack) as recorder:
        try:
            docs = [
                storage_class(LOCAL, "kubernetes.io/no-provisioner"),
                topology(),
                claim("local-0", LOCAL),
                pod_group("local", 1),
                with_claim(member("local", 0), "local-0"),
            ]
            await kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))

            async def waiting() -> str:
                pod = recorder.pods.get("local-0") or {}
                for c in (pod.get("status") or {}).get("conditions") or ():
                    if c.get("type") == "PodScheduled" and c.get("status") == "False":
                        return str(c.get("message") or "")
                return ""

            message = await until(waiting, "the pod reported waiting", WAIT)
            assert "PersistentVolumeClaim local-0" in message, message
            assert "has no provisioner" in message, message
            assert not bound(recorder, "local")
            found = await claims()
            annotations = found["local-0"]["metadata"].get("annotations") or {}
            assert SELECTED_NODE_ANNOTATION not in annotations
        finally:
            await remove_gangs(recorder, "local")
            await kubectl("delete", "pvc", "local-0", "--ignore-not-found", "--wait=false")
            await kubectl("delete", "storageclass", LOCAL, "--ignore-not-found", "--wait=false")
            await kubectl(
                "delete",
                "clusternetworktopologies.scheduling.koordinator.sh/default",
                "--ignore-not-found",
                "--wait=false",
            )

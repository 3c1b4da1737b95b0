"""Deletion semantics (graceful pods, finalizers, garbage collection), binding, eviction and
PodDisruptionBudgets."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from tests.conformance.k8s.conftest import Kube


def pod(name: str, labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}, **meta},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    """Controllers (GC, disruption) are asynchronous on a real apiserver: poll."""
    async with asyncio.timeout(timeout):
        for _ in range(int(timeout / 0.05) + 1):
            if await check():
                return
            await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


async def exists(call: Callable[[], Awaitable[Any]]) -> bool:
    try:
        await call()
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


async def bind(kube: Kube, name: str, node: str) -> tuple[int, Any]:
    return await kube.request(
        "POST",
        f"/api/v1/namespaces/{kube.namespace}/pods/{name}/binding",
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        },
    )


async def make_running_ready(kube: Kube, name: str) -> None:
    await kube.core.patch_namespaced_pod_status(
        name,
        kube.namespace,
        {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
    )


async def test_binding_sets_node_name_once_then_conflicts(kube: Kube) -> None:
    await kube.core.create_namespaced_pod(kube.namespace, pod("b"))
    status, body = await bind(kube, "b", "node-a")
    assert status == 201, body
    read = await kube.core.read_namespaced_pod("b", kube.namespace)
    assert read.spec.node_name == "node-a"
    status, body = await bind(kube, "b", "node-b")
    assert status == 409
    assert body["reason"] == "Conflict"


async def test_unbound_pod_is_deleted_immediately(kube: Kube) -> None:
    await kube.core.create_namespaced_pod(kube.namespace, pod("u"))
    await kube.core.delete_namespaced_pod("u", kube.namespace)
    assert not await exists(lambda: kube.core.read_namespaced_pod("u", kube.namespace))


async def test_bound_pod_deletion_is_graceful_until_deleted_with_grace_zero(kube: Kube) -> None:
    await kube.core.create_namespaced_pod(kube.namespace, pod("g"))
    await bind(kube, "g", "node-a")
    await kube.core.delete_namespaced_pod("g", kube.namespace, grace_period_seconds=30)
    read = await kube.core.read_namespaced_pod("g", kube.namespace)
    assert read.metadata.deletion_timestamp is not None
    assert read.metadata.deletion_grace_period_seconds == 30
    await kube.core.delete_namespaced_pod("g", kube.namespace, grace_period_seconds=0)
    assert not await exists(lambda: kube.core.read_namespaced_pod("g", kube.namespace))


async def test_finalizers_hold_object_until_removed(kube: Kube) -> None:
    await kube.core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "f", "finalizers": ["example.com/hold"]}}
    )
    await kube.core.delete_namespaced_config_map("f", kube.namespace)
    held = await kube.core.read_namespaced_config_map("f", kube.namespace)
    assert held.metadata.deletion_timestamp is not None
    await kube.core.patch_namespaced_config_map(
        "f", kube.namespace, {"metadata": {"finalizers": None}}
    )
    assert not await exists(lambda: kube.core.read_namespaced_config_map("f", kube.namespace))


def owned_by(owner: Any, kind: str = "ConfigMap") -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "v1",
            "kind": kind,
            "name": owner.metadata.name,
            "uid": owner.metadata.uid,
            "blockOwnerDeletion": True,
        }
    ]


async def test_background_deletion_collects_dependents(kube: Kube) -> None:
    owner = await kube.core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "owner"}}
    )
    await kube.core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "child", "ownerReferences": owned_by(owner)}}
    )
    await kube.core.delete_namespaced_config_map(
        "owner", kube.namespace, propagation_policy="Background"
    )

    async def child_gone() -> bool:
        return not await exists(
            lambda: kube.core.read_namespaced_config_map("child", kube.namespace)
        )

    await eventually(child_gone)


async def test_orphan_deletion_keeps_dependents_without_owner_reference(kube: Kube) -> None:
    owner = await kube.core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "owner"}}
    )
    await kube.core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "orphan", "ownerReferences": owned_by(owner)}}
    )
    await kube.core.delete_namespaced_config_map(
        "owner", kube.namespace, propagation_policy="Orphan"
    )

    async def orphaned() -> bool:
        child = await kube.core.read_namespaced_config_map("orphan", kube.namespace)
        return not child.metadata.owner_references

    await eventually(orphaned)

    async def owner_gone() -> bool:
        # The garbage collector orphans the dependent first, then lifts the owner's finalizer.
        read = kube.core.read_namespaced_config_map
        return not await exists(lambda: read("owner", kube.namespace))

    await eventually(owner_gone)


async def test_foreground_deletion_removes_dependents_before_owner(kube: Kube) -> None:
    owner = await kube.core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "fg"}}
    )
    await kube.core.create_namespaced_config_map(
        kube.namespace,
        {
            "metadata": {
                "name": "fg-child",
                "ownerReferences": owned_by(owner),
                "finalizers": ["example.com/hold"],
            }
        },
    )
    await kube.core.delete_namespaced_config_map(
        "fg", kube.namespace, propagation_policy="Foreground"
    )

    async def owner_waiting() -> bool:
        held = await kube.core.read_namespaced_config_map("fg", kube.namespace)
        return "foregroundDeletion" in (held.metadata.finalizers or [])

    await eventually(owner_waiting)
    await kube.core.patch_namespaced_config_map(
        "fg-child", kube.namespace, {"metadata": {"finalizers": None}}
    )

    async def both_gone() -> bool:
        owner_left = await exists(
            lambda: kube.core.read_namespaced_config_map("fg", kube.namespace)
        )
        child_left = await exists(
            lambda: kube.core.read_namespaced_config_map("fg-child", kube.namespace)
        )
        return not owner_left and not child_left

    await eventually(both_gone)


async def create_pdb(kube: Kube, name: str, spec: dict[str, Any]) -> None:
    await kube.policy.create_namespaced_pod_disruption_budget(
        kube.namespace, {"metadata": {"name": name}, "spec": spec}
    )


async def evict(kube: Kube, name: str) -> tuple[int, Any]:
    return await kube.request(
        "POST",
        f"/api/v1/namespaces/{kube.namespace}/pods/{name}/eviction",
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": kube.namespace},
        },
    )


def replicator_crd(group: str) -> dict[str, Any]:
    """A minimal workload kind with a scale subresource, as NodeSet has: the disruption
    controller reads a controller's desired replicas through it."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"replicators.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "replicators", "singular": "replicator", "kind": "Replicator"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                        },
                    },
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


Controller = Callable[[int], Awaitable[dict[str, Any]]]


@pytest.fixture
async def controller(kube: Kube) -> AsyncIterator[Controller]:
    """Makes a Replicator of `replicas` and returns the controller reference its pods carry."""
    group = f"r{uuid.uuid4().hex[:6]}.example.com"
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    status, body = await kube.request("POST", crds, replicator_crd(group))
    assert status == 201, body
    base = f"/apis/{group}/v1/namespaces/{kube.namespace}/replicators"

    async def served() -> bool:
        return (await kube.request("GET", base))[0] == 200

    await eventually(served, timeout=30.0)

    async def make(replicas: int) -> dict[str, Any]:
        name = f"rep-{uuid.uuid4().hex[:6]}"
        status, created = await kube.request(
            "POST",
            base,
            {
                "apiVersion": f"{group}/v1",
                "kind": "Replicator",
                "metadata": {"name": name},
                "spec": {"replicas": replicas},
            },
        )
        assert status == 201, created
        return {
            "apiVersion": f"{group}/v1",
            "kind": "Replicator",
            "name": name,
            "uid": created["metadata"]["uid"],
            "controller": True,
        }

    try:
        yield make
    finally:
        await kube.request("DELETE", f"{crds}/replicators.{group}")


def nudging(
    kube: Kube, names: list[str], check: Callable[[], Awaitable[bool]]
) -> Callable[[], Awaitable[bool]]:
    """`check`, touching a pod's annotation every 40 polls while it fails. The real disruption
    controller learns a kind created moments ago only on its 30 s discovery refresh, and retries
    a budget whose sync failed before that with a growing backoff, unless one of its pods
    changes: the touch makes it sync again once it knows the kind."""
    polls = 0

    async def check_or_touch() -> bool:
        nonlocal polls
        if await check():
            return True
        polls += 1
        if polls % 40 == 0:
            await kube.core.patch_namespaced_pod(
                names[0], kube.namespace, {"metadata": {"annotations": {"touch": str(polls)}}}
            )
        return False

    return check_or_touch


async def ready_pods(
    kube: Kube, count: int, labels: dict[str, str], owner: dict[str, Any] | None = None
) -> list[str]:
    names = []
    for i in range(count):
        name = f"{labels['app']}-{i}"
        meta = {"ownerReferences": [owner]} if owner else {}
        await kube.core.create_namespaced_pod(kube.namespace, pod(name, labels, **meta))
        await bind(kube, name, "node-a")
        await make_running_ready(kube, name)
        names.append(name)
    return names


async def test_pdb_status_tracks_healthy_pods(kube: Kube) -> None:
    await ready_pods(kube, 3, {"app": "st"})
    await create_pdb(kube, "st", {"minAvailable": 2, "selector": {"matchLabels": {"app": "st"}}})

    async def settled() -> bool:
        pdb = await kube.policy.read_namespaced_pod_disruption_budget("st", kube.namespace)
        s = pdb.status
        return bool(
            s
            and s.current_healthy == 3
            and s.desired_healthy == 2
            and s.expected_pods == 3
            and s.disruptions_allowed == 1
        )

    await eventually(settled)


async def test_eviction_honours_pod_disruption_budget(kube: Kube, controller: Controller) -> None:
    names = await ready_pods(kube, 2, {"app": "ev"}, await controller(2))
    await create_pdb(kube, "ev", {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "ev"}}})

    async def allows_one() -> bool:
        pdb = await kube.policy.read_namespaced_pod_disruption_budget("ev", kube.namespace)
        return bool(pdb.status and pdb.status.disruptions_allowed == 1)

    await eventually(nudging(kube, names, allows_one), timeout=90.0)
    status, body = await evict(kube, names[0])
    assert status == 201, body
    evicted = await kube.core.read_namespaced_pod(names[0], kube.namespace)
    assert evicted.metadata.deletion_timestamp is not None
    status, body = await evict(kube, names[1])
    assert status == 429
    assert body["reason"] == "TooManyRequests"
    assert any(c["reason"] == "DisruptionBudget" for c in body["details"]["causes"])


async def test_an_integer_min_available_expects_the_selected_pods_not_the_controllers_scale(
    kube: Kube, controller: Controller
) -> None:
    # A NodeSet's protection budget (rule 4a): minAvailable 2147483647, the largest int32, is
    # accepted; the disruption controller expects the 3 selected pods, not the replicas (1)
    # of their controller's scale, so no eviction is allowed after a scale-down.
    names = await ready_pods(kube, 3, {"app": "never"}, await controller(1))
    spec = {"minAvailable": 2147483647, "selector": {"matchLabels": {"app": "never"}}}
    await create_pdb(kube, "never", spec)

    async def settled() -> bool:
        pdb = await kube.policy.read_namespaced_pod_disruption_budget("never", kube.namespace)
        s = pdb.status
        return bool(
            s
            and s.current_healthy == 3
            and s.expected_pods == 3
            and s.desired_healthy == 2147483647
            and s.disruptions_allowed == 0
        )

    await eventually(nudging(kube, names, settled), timeout=90.0)
    status, body = await evict(kube, names[0])
    assert status == 429, body


async def test_pdb_with_an_empty_selector_covers_every_pod_of_its_namespace(kube: Kube) -> None:
    # policy/v1: an empty selector ({}) selects all pods in the namespace (a null one, none).
    names = await ready_pods(kube, 3, {"app": "all"})
    await create_pdb(kube, "every", {"minAvailable": 2, "selector": {}})

    async def allows_one() -> bool:
        pdb = await kube.policy.read_namespaced_pod_disruption_budget("every", kube.namespace)
        s = pdb.status
        return bool(s and s.current_healthy == 3 and s.disruptions_allowed == 1)

    await eventually(nudging(kube, names, allows_one), timeout=90.0)
    assert (await evict(kube, names[0]))[0] == 201
    await eventually(lambda: _allowed(kube, "every", 0))
    status, body = await evict(kube, names[1])
    assert status == 429, body


async def test_eviction_with_percent_min_available(kube: Kube, controller: Controller) -> None:
    names = await ready_pods(kube, 4, {"app": "pct"}, await controller(4))
    await create_pdb(
        kube, "pct", {"minAvailable": "50%", "selector": {"matchLabels": {"app": "pct"}}}
    )

    async def allows_two() -> bool:
        pdb = await kube.policy.read_namespaced_pod_disruption_budget("pct", kube.namespace)
        return bool(pdb.status and pdb.status.disruptions_allowed == 2)

    await eventually(nudging(kube, names, allows_two), timeout=90.0)
    assert (await evict(kube, names[0]))[0] == 201
    await eventually(lambda: _allowed(kube, "pct", 1))
    assert (await evict(kube, names[1]))[0] == 201
    await eventually(lambda: _allowed(kube, "pct", 0))
    assert (await evict(kube, names[2]))[0] == 429


async def test_budget_counting_controllers_allows_nothing_for_pods_without_one(
    kube: Kube,
) -> None:
    # maxUnavailable counts the replicas of the pods' controllers; pods without a controller
    # count for none, so nothing may be evicted (the real controller warns UnmanagedPods).
    names = await ready_pods(kube, 2, {"app": "orphan"})
    await create_pdb(
        kube, "orphan", {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "orphan"}}}
    )

    async def computed() -> bool:
        pdb = await kube.policy.read_namespaced_pod_disruption_budget("orphan", kube.namespace)
        return bool(pdb.status and pdb.status.current_healthy == 2)

    await eventually(computed, timeout=30.0)
    pdb = await kube.policy.read_namespaced_pod_disruption_budget("orphan", kube.namespace)
    assert (pdb.status.expected_pods, pdb.status.disruptions_allowed) == (0, 0)
    status, body = await evict(kube, names[0])
    assert status == 429, body


async def _allowed(kube: Kube, name: str, expected: int) -> bool:
    pdb = await kube.policy.read_namespaced_pod_disruption_budget(name, kube.namespace)
    return bool(pdb.status and pdb.status.disruptions_allowed == expected)


async def test_eviction_without_budget_deletes_unbound_pod(kube: Kube) -> None:
    await kube.core.create_namespaced_pod(kube.namespace, pod("free"))
    status, _ = await evict(kube, "free")
    assert status == 201
    assert not await exists(lambda: kube.core.read_namespaced_pod("free", kube.namespace))


@pytest.mark.parametrize("policy", ["Always", "OnFailure"])
async def test_job_template_restart_policy_must_be_never_or_on_failure(
    kube: Kube, policy: str
) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {
            "template": {
                "spec": {"restartPolicy": policy, "containers": [{"name": "c", "image": "x"}]}
            }
        },
    }
    status, body = await kube.request(
        "POST", f"/apis/batch/v1/namespaces/{kube.namespace}/jobs", job
    )
    if policy == "Always":
        assert status == 422
        assert any(
            c["field"] == "spec.template.spec.restartPolicy" for c in body["details"]["causes"]
        )
    else:
        assert status == 201
        assert body["spec"]["selector"]["matchLabels"]


async def test_a_pending_pod_is_evicted_whatever_its_budget_and_a_running_one_is_not(
    kube: Kube, controller: Controller
) -> None:
    # A budget of maxUnavailable 0 over a label (as a NodeSet's over its pods running jobs):
    # kube-apiserver refuses to evict a Running pod it selects, and ignores budgets for a
    # Pending one (canIgnorePDB).
    owner = await controller(2)
    (running,) = await ready_pods(kube, 1, {"app": "held"}, owner)
    await kube.core.create_namespaced_pod(
        kube.namespace, pod("held-pending", {"app": "held"}, ownerReferences=[owner])
    )
    await create_pdb(
        kube, "held", {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "held"}}}
    )

    async def computed() -> bool:
        pdb = await kube.policy.read_namespaced_pod_disruption_budget("held", kube.namespace)
        return bool(pdb.status and pdb.status.observed_generation)

    await eventually(nudging(kube, [running], computed), timeout=90.0)
    status, body = await evict(kube, running)
    assert status == 429, body
    status, body = await evict(kube, "held-pending")
    assert status == 201, body

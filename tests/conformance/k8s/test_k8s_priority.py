"""Pod priority as the Priority admission plugin sets it: a pod's priorityClassName resolves to
spec.priority and spec.preemptionPolicy at creation (what topology-placer's preemption reads)."""

from __future__ import annotations

from typing import Any

from tests.conformance.k8s.conftest import Kube

CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"


def pod(kube: Kube, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": kube.namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec},
    }


async def make_class(kube: Kube, value: int, **extra: Any) -> str:
    name = kube.unique("prio")
    status, body = await kube.request(
        "POST",
        CLASSES,
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
            **extra,
        },
    )
    assert status == 201, body
    return name


async def create_pod(kube: Kube, body: dict[str, Any]) -> tuple[int, Any]:
    return await kube.request("POST", f"/api/v1/namespaces/{kube.namespace}/pods", body)


async def test_priority_class_name_resolves_to_priority_and_preemption_policy(kube: Kube) -> None:
    name = await make_class(kube, 1000, preemptionPolicy="Never")
    try:
        status, created = await create_pod(kube, pod(kube, "high", priorityClassName=name))
        assert status == 201, created
        assert created["spec"]["priority"] == 1000
        assert created["spec"]["preemptionPolicy"] == "Never"
    finally:
        await kube.request("DELETE", f"{CLASSES}/{name}")


async def test_a_pod_without_a_class_gets_priority_zero(kube: Kube) -> None:
    status, created = await create_pod(kube, pod(kube, "plain"))
    assert status == 201, created
    assert created["spec"]["priority"] == 0
    assert created["spec"]["preemptionPolicy"] == "PreemptLowerPriority"


async def test_a_pod_naming_a_missing_class_is_refused(kube: Kube) -> None:
    status, body = await create_pod(kube, pod(kube, "lost", priorityClassName="no-such-class"))
    assert status == 403, body
    assert "no PriorityClass with name no-such-class was found" in body["message"]


async def test_a_pod_may_not_set_a_priority_its_class_does_not_give(kube: Kube) -> None:
    name = await make_class(kube, 10)
    try:
        status, body = await create_pod(
            kube, pod(kube, "liar", priorityClassName=name, priority=99)
        )
        assert status == 403, body
        assert "must not be provided in pod spec" in body["message"]
    finally:
        await kube.request("DELETE", f"{CLASSES}/{name}")


async def test_the_system_priority_classes_exist(kube: Kube) -> None:
    for name, value in (
        ("system-cluster-critical", 2000000000),
        ("system-node-critical", 2000001000),
    ):
        status, body = await kube.request("GET", f"{CLASSES}/{name}")
        assert status == 200 and body["value"] == value

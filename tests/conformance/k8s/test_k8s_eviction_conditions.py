"""What an eviction writes on the pod before deleting it: kube-apiserver (PodDisruptionConditions,
on by default since 1.26 and GA in 1.31) adds DisruptionTarget=True with reason
EvictionByEvictionAPI, which a Job's podFailurePolicy `onPodConditions` rule matches."""

from __future__ import annotations

from typing import Any

from tests.conformance.k8s.conftest import Kube
from tests.conformance.k8s.test_k8s_lifecycle import evict, ready_pods


def disruption_target(pod: Any) -> Any:
    for condition in pod.status.conditions or []:
        if condition.type == "DisruptionTarget":
            return condition
    return None


async def test_evicted_pod_gets_the_disruption_target_condition(kube: Kube) -> None:
    (name,) = await ready_pods(kube, 1, {"app": "evicted"})
    before = await kube.core.read_namespaced_pod(name, kube.namespace)
    assert disruption_target(before) is None
    status, body = await evict(kube, name)
    assert status == 201, body
    # Bound to a node without a kubelet, the pod stays terminating, so its status can be read.
    evicted = await kube.core.read_namespaced_pod(name, kube.namespace)
    assert evicted.metadata.deletion_timestamp is not None
    condition = disruption_target(evicted)
    assert condition is not None
    assert (condition.status, condition.reason) == ("True", "EvictionByEvictionAPI")
    assert condition.message == "Eviction API: evicting"
    assert condition.last_transition_time is not None


async def test_dry_run_eviction_writes_no_condition(kube: Kube) -> None:
    (name,) = await ready_pods(kube, 1, {"app": "dry"})
    status, body = await kube.request(
        "POST",
        f"/api/v1/namespaces/{kube.namespace}/pods/{name}/eviction?dryRun=All",
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": kube.namespace},
            "deleteOptions": {"dryRun": ["All"]},
        },
    )
    assert status == 201, body
    pod = await kube.core.read_namespaced_pod(name, kube.namespace)
    assert pod.metadata.deletion_timestamp is None
    assert disruption_target(pod) is None

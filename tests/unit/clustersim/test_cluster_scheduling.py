from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.cluster.scheduler import DefaultScheduler, InputCache
from clustersim.cluster.scheduling import (
    AFFINITY_MISMATCH,
    UNSCHEDULABLE_NODE,
    choose_node,
    infeasibility_reasons,
    named_nodes,
    needs_scheduling,
    requested_by_node,
)
from clustersim.kube.store import Store
from nodeflow_kube.quantity import parse_resources


def node(
    name: str,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    cpu: str = "8",
    gpu: str = "8",
    pods: str = "110",
    unschedulable: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"taints": taints or []}
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
        "status": {
            "allocatable": {"cpu": cpu, "memory": "64Gi", "nvidia.com/gpu": gpu, "pods": pods}
        },
    }


def pod(
    cpu: str | None = None,
    gpu: str | None = None,
    node_selector: dict[str, str] | None = None,
    affinity_terms: list[dict[str, Any]] | None = None,
    tolerations: list[dict[str, str]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    requests = {}
    if cpu:
        requests["cpu"] = cpu
    if gpu:
        requests["nvidia.com/gpu"] = gpu
    resources: dict[str, Any] = {"requests": requests}
    if gpu:
        # An extended resource is requested through a limit equal to it, as the API requires.
        resources["limits"] = {"nvidia.com/gpu": gpu}
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "image": "x", "resources": resources}],
        **extra,
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    if affinity_terms is not None:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": affinity_terms
                }
            }
        }
    if tolerations:
        spec["tolerations"] = tolerations
    return {"metadata": {"name": "p", "namespace": "default"}, "spec": spec, "status": {}}


def test_affinity_terms_are_ored_and_match_fields_by_name() -> None:
    n = node("n1", {"zone": "a"})
    by_name = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
    assert infeasibility_reasons(pod(affinity_terms=by_name), n, {}) == []
    other = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]
    assert infeasibility_reasons(pod(affinity_terms=other), n, {}) == [AFFINITY_MISMATCH]
    either = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
    ]
    assert infeasibility_reasons(pod(affinity_terms=either), n, {}) == []
    assert infeasibility_reasons(pod(affinity_terms=[{}]), n, {}) == [AFFINITY_MISMATCH]


def test_node_selector() -> None:
    n = node("n1", {"pool": "gpu"})
    assert infeasibility_reasons(pod(node_selector={"pool": "gpu"}), n, {}) == []
    assert infeasibility_reasons(pod(node_selector={"pool": "cpu"}), n, {}) == [AFFINITY_MISMATCH]


def test_taints_and_tolerations() -> None:
    taint = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    n = node("n1", taints=[taint])
    reasons = infeasibility_reasons(pod(), n, {})
    assert reasons == ["node(s) had untolerated taint {dedicated: gpu}"]
    tolerate = {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
    assert infeasibility_reasons(pod(tolerations=[tolerate]), n, {}) == []
    soft = node("n2", taints=[{"key": "x", "effect": "PreferNoSchedule"}])
    assert infeasibility_reasons(pod(), soft, {}) == []


def test_unschedulable_node_needs_toleration() -> None:
    n = node("n1", unschedulable=True)
    assert infeasibility_reasons(pod(), n, {}) == [UNSCHEDULABLE_NODE]
    toleration = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}
    assert infeasibility_reasons(pod(tolerations=[toleration]), n, {}) == []


def test_resource_fit_counts_other_pods() -> None:
    n = node("n1", cpu="4", gpu="8")
    other = pod(cpu="3", gpu="4", nodeName="n1")
    finished = pod(cpu="4", nodeName="n1")
    finished["status"]["phase"] = "Succeeded"
    used = requested_by_node([other, finished])
    assert infeasibility_reasons(pod(cpu="1", gpu="4"), n, used["n1"]) == []
    assert infeasibility_reasons(pod(cpu="1500m", gpu="5"), n, used["n1"]) == [
        "Insufficient cpu",
        "Insufficient nvidia.com/gpu",
    ]


def test_choose_node_message_and_spread() -> None:
    nodes = [node("a", cpu="1"), node("b", {"pool": "x"}, cpu="1")]
    chosen, message = choose_node(pod(cpu="2"), nodes, {})
    assert chosen is None
    assert message == "0/2 nodes are available: 2 Insufficient cpu."
    chosen, message = choose_node(pod(cpu="2", node_selector={"pool": "y"}), nodes, {})
    assert message == (
        "0/2 nodes are available: 2 Insufficient cpu, "
        "2 node(s) didn't match Pod's node affinity/selector."
    )
    busy = {"a": parse_resources({"cpu": "500m", "pods": "1"})}
    assert choose_node(pod(), nodes, busy) == ("b", "")


def test_needs_scheduling_only_default_scheduler_and_unbound() -> None:
    assert needs_scheduling(pod())
    assert needs_scheduling(pod(schedulerName="default-scheduler"))
    assert not needs_scheduling(pod(schedulerName="topology-placer"))
    assert not needs_scheduling(pod(nodeName="n1"))


label_values = st.sampled_from(["a", "b", "c"])
taint_strategy = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["k1", "k2"]),
        "value": label_values,
        "effect": st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"]),
    }
)
node_strategy = st.builds(
    lambda i, labels, taints, cpu, gpu, unsched: node(
        f"n{i}", labels, taints, str(cpu), str(gpu), unschedulable=unsched
    ),
    st.integers(0, 1000),
    st.dictionaries(st.sampled_from(["pool", "zone"]), label_values, max_size=2),
    st.lists(taint_strategy, max_size=2),
    st.integers(0, 8),
    st.integers(0, 8),
    st.booleans(),
)
pod_strategy = st.builds(
    lambda cpu, gpu, selector, op, values, tolerations: pod(
        cpu=str(cpu),
        gpu=str(gpu),
        node_selector=selector,
        affinity_terms=[{"matchExpressions": [{"key": "zone", "operator": op, "values": values}]}],
        tolerations=tolerations,
    ),
    st.integers(0, 8),
    st.integers(0, 8),
    st.dictionaries(st.just("pool"), label_values, max_size=1),
    st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]),
    st.lists(label_values, min_size=1, max_size=2),
    st.lists(
        st.fixed_dictionaries(
            {"key": st.sampled_from(["k1", "k2"]), "operator": st.just("Exists")}
        ),
        max_size=2,
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    nodes=st.lists(
        node_strategy, min_size=1, max_size=6, unique_by=lambda n: n["metadata"]["name"]
    ),
    pods=st.lists(pod_strategy, min_size=1, max_size=6),
)
def test_never_binds_to_an_infeasible_node(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> None:
    """Placing pods one by one never overcommits a node or ignores a predicate."""
    placed: list[dict[str, Any]] = []
    by_name = {n["metadata"]["name"]: n for n in nodes}
    for candidate in pods:
        used = requested_by_node(placed)
        chosen, message = choose_node(candidate, nodes, used)
        feasible = [
            n["metadata"]["name"]
            for n in nodes
            if not infeasibility_reasons(candidate, n, used.get(n["metadata"]["name"], {}))
        ]
        if chosen is None:
            assert feasible == []
            assert message.startswith(f"0/{len(nodes)} nodes are available")
            continue
        assert chosen in feasible
        assert infeasibility_reasons(candidate, by_name[chosen], used.get(chosen, {})) == []
        bound = dict(candidate, spec=dict(candidate["spec"], nodeName=chosen))
        placed.append(bound)
    for name, in_use in requested_by_node(placed).items():
        allocatable = parse_resources(by_name[name]["status"]["allocatable"])
        for resource, amount in in_use.items():
            assert amount <= allocatable.get(resource, Fraction(0))


def _pinned(*terms: list[str]) -> dict[str, Any]:
    return {
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": names}
                                ]
                            }
                            for names in terms
                        ]
                    }
                }
            }
        }
    }


def test_named_nodes_is_the_union_of_terms_that_all_name_nodes() -> None:
    assert named_nodes(_pinned(["a"], ["b", "c"])) == frozenset({"a", "b", "c"})
    assert named_nodes({"spec": {}}) is None
    mixed = _pinned(["a"])
    mixed["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ].append({"matchExpressions": [{"key": "x", "operator": "Exists"}]})
    assert named_nodes(mixed) is None  # a term without names lets any node through


def test_input_cache_recomputes_only_when_what_it_reads_changes_and_after_forget() -> None:
    calls: list[str] = []

    def compute(obj: Mapping[str, Any]) -> dict[str, Fraction]:
        calls.append(obj["v"])
        return {"cpu": Fraction(int(obj["v"]))}

    cache = InputCache(compute, lambda obj: obj["v"])
    first = {"v": "1", "status": "a"}
    assert cache.get("n1", first) == {"cpu": 1}
    assert cache.get("n1", {"v": "1", "status": "b"}) == {"cpu": 1}
    assert calls == ["1"]  # another version, same input: not recomputed
    assert cache.get("n1", {"v": "2"}) == {"cpu": 2}
    assert calls == ["1", "2"]
    cache.forget("n1")
    cache.get("n1", {"v": "2"})
    assert calls[-1] == "2"  # forgotten: computed again


def test_a_status_change_keeps_the_charge_and_a_spec_change_recharges_the_node() -> None:
    store = Store()
    scheduler = DefaultScheduler(store)
    store.create("nodes", store_node("n1"))
    bound = store_pod("p1", "2")
    bound["spec"]["nodeName"] = "n1"
    created = store.create("pods", bound, namespace="default")
    scheduler.initial_keys()
    assert scheduler._used["n1"]["nvidia.com/gpu"] == 2
    running = {**created, "status": {"phase": "Running"}}
    assert scheduler._track(running, "MODIFIED") is False
    assert scheduler._used["n1"]["nvidia.com/gpu"] == 2
    resized = {**running, "spec": {**running["spec"]}}
    resized["spec"]["containers"] = [
        {**c, "resources": {"requests": {"nvidia.com/gpu": "1"}}}
        for c in running["spec"]["containers"]
    ]
    scheduler._track(resized, "MODIFIED")
    assert scheduler._used["n1"]["nvidia.com/gpu"] == 1
    scheduler._track(resized, "DELETED")
    assert scheduler._used["n1"].get("nvidia.com/gpu", 0) == 0


# --- the scheduler as a controller over the store -------------------------------------------


def store_node(name: str, gpu: str = "8") -> dict[str, Any]:
    body = node(name, gpu=gpu)
    body["apiVersion"], body["kind"] = "v1", "Node"
    return body


def store_pod(name: str, gpu: str, pinned_to: str | None = None) -> dict[str, Any]:
    terms = (
        [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [pinned_to]}]}]
        if pinned_to
        else None
    )
    body = pod(gpu=gpu, affinity_terms=terms)
    body["apiVersion"], body["kind"] = "v1", "Pod"
    body["metadata"] = {"name": name, "namespace": "default"}
    return body


async def settle(scheduler: DefaultScheduler, store: Store, names: list[str]) -> dict[str, str]:
    """Run the scheduler until the queue is empty; the node of each named pod ('' unbound)."""
    for _ in range(200):
        await asyncio.sleep(0)
        if not len(scheduler.queue):
            break
    return {
        name: store.get("pods", name, "default")["spec"].get("nodeName") or "" for name in names
    }


async def test_a_pinned_pod_is_placed_without_reading_the_other_pods_or_nodes() -> None:
    """kube-scheduler's NodeAffinity PreFilter: a pod pinned to one node costs O(1), however
    many nodes and pods the cluster has (no list of either while it is placed)."""
    store = Store()
    for index in range(50):
        store.create("nodes", store_node(f"n{index:02d}"))
    scheduler = DefaultScheduler(store)
    task = asyncio.create_task(scheduler.run())
    try:
        await settle(scheduler, store, [])
        listed: list[str] = []
        real_list = store.list

        def counting_list(resource: Any, *args: Any, **kwargs: Any) -> Any:
            listed.append(str(resource))
            return real_list(resource, *args, **kwargs)

        store.list = counting_list  # type: ignore[method-assign]
        store.create("pods", store_pod("p", "8", pinned_to="n17"))
        assert await settle(scheduler, store, ["p"]) == {"p": "n17"}
        assert listed == []
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_room_freed_by_a_deleted_pod_schedules_the_pod_waiting_for_it() -> None:
    store = Store()
    store.create("nodes", store_node("only", gpu="8"))
    scheduler = DefaultScheduler(store)
    task = asyncio.create_task(scheduler.run())
    try:
        store.create("pods", store_pod("first", "8", pinned_to="only"))
        assert await settle(scheduler, store, ["first"]) == {"first": "only"}
        store.create("pods", store_pod("second", "8", pinned_to="only"))
        assert await settle(scheduler, store, ["second"]) == {"second": ""}
        message = next(
            c["message"]
            for c in store.get("pods", "second", "default")["status"]["conditions"]
            if c["type"] == "PodScheduled"
        )
        assert "Insufficient nvidia.com/gpu" in message
        store.delete("pods", "first", "default", grace_period_seconds=0)
        assert await settle(scheduler, store, ["second"]) == {"second": "only"}
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

"""A pod's effective requests and the NodeResourcesFit check."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodeflow_kube.resources import (
    container_requests,
    insufficient_resources,
    node_allocatable,
    pod_requests,
)
from tests.unit.kube.builders import node


def container(name: str, requests: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": requests} if requests else {}
    return {"name": name, "resources": resources, **extra}


def sidecar(name: str, requests: dict[str, str]) -> dict[str, Any]:
    return container(name, requests, restartPolicy="Always")


def test_pod_requests_uses_limits_init_containers_and_counts_a_pod() -> None:
    spec = {
        "containers": [
            {"name": "a", "resources": {"limits": {"cpu": "2"}}},
            {"name": "b", "resources": {"requests": {"cpu": "500m"}}},
        ],
        "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "4"}}}],
    }
    assert pod_requests(spec) == {"cpu": Fraction(4), "pods": Fraction(1)}


def test_limits_stand_in_only_for_requests_left_unset() -> None:
    resources = {"limits": {"cpu": "4", "memory": "1Gi"}, "requests": {"cpu": "1"}}
    assert container_requests({"resources": resources}) == {"cpu": 1, "memory": 2**30}


def test_containers_sum_and_the_largest_init_container_is_a_floor() -> None:
    spec = {
        "containers": [container("a", {"cpu": "1", "memory": "1Gi"}), container("b", {"cpu": "1"})],
        "initContainers": [container("i1", {"memory": "4Gi"}), container("i2", {"cpu": "1"})],
    }
    assert pod_requests(spec) == {"cpu": 2, "memory": 4 * 2**30, "pods": 1}


def test_sidecars_run_next_to_the_app_and_to_later_init_containers() -> None:
    spec = {
        "containers": [container("app", {"cpu": "2"})],
        "initContainers": [
            container("before", {"cpu": "4"}),
            sidecar("proxy", {"cpu": "1"}),
            container("after", {"cpu": "3"}),
        ],
    }
    # app + proxy = 3; "before" alone = 4; "after" + proxy = 4.
    assert pod_requests(spec)["cpu"] == 4
    spec["initContainers"][2] = container("after", {"cpu": "3500m"})
    assert pod_requests(spec)["cpu"] == Fraction(9, 2)
    spec["containers"] = [container("app", {"cpu": "5"})]
    assert pod_requests(spec)["cpu"] == 6


def test_overhead_is_added_on_top() -> None:
    spec = {
        "containers": [container("a", {"cpu": "1"})],
        "initContainers": [container("i", {"cpu": "3"})],
        "overhead": {"cpu": "250m", "memory": "120Mi"},
    }
    assert pod_requests(spec) == {"cpu": Fraction(13, 4), "memory": 120 * 2**20, "pods": 1}


def test_pod_level_requests_replace_the_containers_for_cpu_memory_and_hugepages() -> None:
    spec = {
        "containers": [container("a", {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "2"})],
        "resources": {"requests": {"cpu": "3", "nvidia.com/gpu": "8"}},
    }
    assert pod_requests(spec) == {"cpu": 3, "memory": 2**30, "nvidia.com/gpu": 2, "pods": 1}


def test_pod_level_limits_default_pod_level_requests_the_containers_do_not_set() -> None:
    spec = {
        "containers": [container("a", {"cpu": "1"})],
        "resources": {"limits": {"cpu": "4", "memory": "8Gi", "hugepages-2Mi": "1Gi"}},
    }
    assert pod_requests(spec) == {
        "cpu": 1,
        "memory": 8 * 2**30,
        "hugepages-2Mi": 2**30,
        "pods": 1,
    }


def test_quantities_are_rounded_up_to_milli_and_bad_entries_are_skipped() -> None:
    spec = {"containers": [container("a", {"cpu": "0.1m", "memory": "a lot"})]}
    assert pod_requests(spec) == {"cpu": Fraction(1, 1000), "pods": 1}


def test_a_malformed_spec_requests_just_a_pod_slot() -> None:
    assert pod_requests({}) == {"pods": 1}
    assert pod_requests({"containers": "x", "initContainers": [None], "overhead": 3}) == {"pods": 1}


def test_allocatable_defaults_to_capacity() -> None:
    assert node_allocatable(node(allocatable={"cpu": "4"})) == {"cpu": 4}
    capacity_only = {"status": {"capacity": {"cpu": "16", "pods": "110"}}}
    assert node_allocatable(capacity_only) == {"cpu": 16, "pods": 110}
    assert node_allocatable({}) == {}


def test_resource_fit_counts_other_pods() -> None:
    allocatable = node_allocatable(node(allocatable={"cpu": "4", "nvidia.com/gpu": "8"}))
    used = {"cpu": Fraction(3), "nvidia.com/gpu": Fraction(4)}
    fits = {"cpu": Fraction(1), "nvidia.com/gpu": Fraction(4)}
    assert insufficient_resources(fits, allocatable, used) == []
    too_big = {"cpu": Fraction(3, 2), "nvidia.com/gpu": Fraction(5)}
    assert insufficient_resources(too_big, allocatable, used) == ["cpu", "nvidia.com/gpu"]


def test_rule_node_selection_resources_fit_allocatable_minus_other_pods() -> None:
    small = node_allocatable(node(allocatable={"cpu": "4", "memory": "8Gi"}))
    request = {"cpu": Fraction(2)}
    assert insufficient_resources(request, small, {"cpu": Fraction(2)}) == []
    assert insufficient_resources(request, small, {"cpu": Fraction(5, 2)}) == ["cpu"]
    gpu = {"cpu": Fraction(1), "nvidia.com/gpu": Fraction(8)}
    assert insufficient_resources(gpu, small, {}) == ["nvidia.com/gpu"]


def test_zero_requests_always_fit_and_pods_count_like_a_resource() -> None:
    full = {"cpu": Fraction(0), "pods": Fraction(1)}
    assert insufficient_resources({"cpu": Fraction(0), "memory": Fraction(0)}, full, full) == []
    assert insufficient_resources({"pods": Fraction(1)}, full, full) == ["pods"]


amounts = st.integers(min_value=0, max_value=16)
cpu_containers = st.lists(
    st.builds(lambda n: container("c", {"cpu": str(n)}), amounts), min_size=0, max_size=3
)
init_containers = st.lists(
    st.builds(
        lambda n, is_sidecar: (
            sidecar("s", {"cpu": str(n)}) if is_sidecar else container("i", {"cpu": str(n)})
        ),
        amounts,
        st.booleans(),
    ),
    max_size=4,
)


def _cpu(raw: dict[str, Any]) -> int:
    return int(raw["resources"]["requests"]["cpu"])


@given(cpu_containers, init_containers)
def test_requests_cover_the_app_with_all_sidecars_and_every_init_moment(
    app: list[dict[str, Any]], inits: list[dict[str, Any]]
) -> None:
    cpu = pod_requests({"containers": app, "initContainers": inits}).get("cpu", Fraction(0))
    sidecars = [c for c in inits if c.get("restartPolicy") == "Always"]
    assert cpu >= sum(_cpu(c) for c in app) + sum(_cpu(c) for c in sidecars)
    started = 0
    moments = []
    for init in inits:
        if init.get("restartPolicy") == "Always":
            started += _cpu(init)
            moments.append(started)
        else:
            moments.append(started + _cpu(init))
        assert cpu >= moments[-1]
    # ... and is exactly the largest of those needs.
    assert cpu == max([sum(_cpu(c) for c in app) + started, *moments])


@given(cpu_containers, init_containers, amounts)
def test_more_app_requests_never_lower_the_pod_requests(
    app: list[dict[str, Any]], inits: list[dict[str, Any]], extra: int
) -> None:
    before = pod_requests({"containers": app, "initContainers": inits})
    after = pod_requests(
        {"containers": [*app, container("x", {"cpu": str(extra)})], "initContainers": inits}
    )
    assert after.get("cpu", 0) >= before.get("cpu", 0)
    assert after["pods"] == before["pods"] == 1


@given(
    st.dictionaries(st.sampled_from(["cpu", "memory", "pods"]), amounts.map(Fraction)),
    st.dictionaries(st.sampled_from(["cpu", "memory", "pods"]), amounts.map(Fraction)),
    st.dictionaries(st.sampled_from(["cpu", "memory", "pods"]), amounts.map(Fraction)),
)
def test_a_request_fits_exactly_when_it_is_within_allocatable_minus_used(
    requests: dict[str, Fraction], allocatable: dict[str, Fraction], used: dict[str, Fraction]
) -> None:
    short = insufficient_resources(requests, allocatable, used)
    for name, amount in requests.items():
        free = allocatable.get(name, Fraction(0)) - used.get(name, Fraction(0))
        assert (name in short) == (amount > 0 and amount > free)
    assert short == sorted(short)

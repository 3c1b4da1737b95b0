"""Rules of fit.py taken one function at a time: milli-units rounded up, the free room and
slots of a node, each filter alone, the memo of parsed versions (the planner's own tests go
through all of these together; the mutation run showed slips here that none of them saw)."""

from __future__ import annotations

from fractions import Fraction
from types import MappingProxyType
from typing import Any

from tests.unit.topology_placer.builders import node, pod
from topology_placer import fit

GPU = "nvidia.com/gpu"


def test_to_milli_rounds_every_quantity_up_to_one_milli_unit() -> None:
    assert fit.to_milli({"cpu": Fraction(2)}) == {"cpu": 2000}
    assert fit.to_milli({"cpu": Fraction(1, 3)}) == {"cpu": 334}
    assert fit.to_milli({"cpu": Fraction(1, 10_000)}) == {"cpu": 1}
    assert fit.to_milli({}) == {}


def test_add_milli_adds_or_with_sign_minus_one_takes_away() -> None:
    total = {"cpu": 1000}
    fit.add_milli(total, {"cpu": 500, GPU: 2000})
    assert total == {"cpu": 1500, GPU: 2000}
    fit.add_milli(total, {"cpu": 1500, GPU: 1000}, -1)
    assert total == {"cpu": 0, GPU: 1000}


def test_largest_request_is_the_component_wise_maximum_of_what_is_asked() -> None:
    requests = [{"cpu": 1000, GPU: 8000}, {"cpu": 4000}, {"cpu": 2000, "memory": 5}]
    assert fit.largest_request(requests) == {"cpu": 4000, GPU: 8000, "memory": 5}
    # Nothing asked is nothing charged: a zero request names no resource.
    assert fit.largest_request([{"cpu": 0}]) == {}
    assert fit.largest_request([{"cpu": 1}]) == {"cpu": 1}
    assert fit.largest_request([]) == {}


def test_version_key_needs_uid_and_resource_version_of_a_mapping() -> None:
    assert fit._version_key({"metadata": {"uid": "u", "resourceVersion": "7"}}) == ("u", "7")
    proxied = MappingProxyType({"uid": "u", "resourceVersion": "7"})
    assert fit._version_key({"metadata": proxied}) == ("u", "7")
    assert fit._version_key({"metadata": {"uid": "u"}}) is None
    assert fit._version_key({"metadata": {"resourceVersion": "7"}}) is None
    assert fit._version_key({"metadata": ["not", "a", "mapping"]}) is None
    assert fit._version_key({}) is None


def test_memo_reads_each_version_once_and_unversioned_objects_every_time() -> None:
    reads: list[str] = []

    def read(obj: Any) -> dict[str, int]:
        reads.append(obj["metadata"].get("name", ""))
        return {"cpu": len(reads)}

    memo = fit._Memo(limit=2)
    versioned = {"metadata": {"name": "a", "uid": "a", "resourceVersion": "1"}}
    assert memo.get(versioned, read) == memo.get(versioned, read) == {"cpu": 1}
    loose = {"metadata": {"name": "loose"}}
    memo.get(loose, read)
    memo.get(loose, read)
    assert reads == ["a", "loose", "loose"]
    # Bounded: at the limit the memo is dropped whole, then fills again.
    memo.get({"metadata": {"name": "b", "uid": "b", "resourceVersion": "1"}}, read)
    assert len(memo.values) == 2
    memo.get({"metadata": {"name": "c", "uid": "c", "resourceVersion": "1"}}, read)
    assert len(memo.values) == 1
    memo.get(versioned, read)
    assert reads[-1] == "a"


def test_nodes_of_one_type_share_one_parsed_allocatable() -> None:
    one, two = node("n1", "s1", "b1"), node("n2", "s1", "b1")
    assert fit._allocatable_by_content(one) is fit._allocatable_by_content(two)
    assert fit.node_allocatable_milli(one)[GPU] == 8000
    bigger = node("n3", "s1", "b1", gpus=16)
    assert fit._allocatable_by_content(bigger)[GPU] == 16000
    # Without status.allocatable, capacity is what the node offers.
    capacity_only = {"metadata": {"name": "n4"}, "status": {"capacity": {"cpu": "2"}}}
    assert fit._allocatable_by_content(capacity_only) == {"cpu": 2000}


def _with_conditions(conditions: Any) -> dict[str, Any]:
    return {"metadata": {"name": "n"}, "status": {"conditions": conditions}}


def test_a_node_is_ready_unless_its_ready_condition_says_otherwise() -> None:
    assert fit.node_is_ready(_with_conditions([{"type": "Ready", "status": "True"}]))
    assert not fit.node_is_ready(_with_conditions([{"type": "Ready", "status": "False"}]))
    assert not fit.node_is_ready(_with_conditions([{"type": "Ready", "status": "Unknown"}]))
    # A fresh node reports no conditions; one without a Ready condition is not judged.
    assert fit.node_is_ready({"metadata": {"name": "n"}})
    assert fit.node_is_ready(_with_conditions(None))
    assert fit.node_is_ready(_with_conditions([{"type": "DiskPressure", "status": "False"}]))
    # The first Ready condition decides; entries that are not objects are passed over.
    mixed = ["junk", {"type": "Ready", "status": "False"}, {"type": "Ready", "status": "True"}]
    assert not fit.node_is_ready(_with_conditions(mixed))


def test_a_node_is_cordoned_only_when_its_spec_says_unschedulable() -> None:
    assert fit.node_is_cordoned(node("n", "s1", "b1", unschedulable=True))
    assert not fit.node_is_cordoned(node("n", "s1", "b1"))
    assert not fit.node_is_cordoned({"metadata": {"name": "n"}})


def _spec(**kwargs: Any) -> dict[str, Any]:
    spec: dict[str, Any] = pod("p", **kwargs)["spec"]
    return spec


def test_filter_reason_names_each_filter_alone() -> None:
    plain = _spec()
    assert fit.filter_reason(plain, node("n", "s1", "b1")) is None
    assert fit.filter_reason(plain, node("n", "s1", "b1", unschedulable=True)) == "cordoned"
    assert fit.filter_reason(plain, node("n", "s1", "b1", ready=False)) == "not ready"
    tainted = node("n", "s1", "b1", taints=[{"key": "gpu", "effect": "NoSchedule"}])
    assert fit.filter_reason(plain, tainted) == "untolerated taint gpu"
    tolerant = _spec(tolerations=[{"key": "gpu", "operator": "Exists"}])
    assert fit.filter_reason(tolerant, tainted) is None
    # PreferNoSchedule is no filter.
    soft = node("n", "s1", "b1", taints=[{"key": "gpu", "effect": "PreferNoSchedule"}])
    assert fit.filter_reason(plain, soft) is None
    # A node object without a spec (nothing tainted, nothing cordoned) passes.
    specless = {"metadata": {"name": "n", "labels": {}}, "status": {}}
    assert fit.filter_reason(plain, specless) is None
    selecting = dict(plain, nodeSelector={"zone": "a"})
    assert fit.filter_reason(selecting, node("n", "s1", "b1")) == "node affinity"
    assert fit.filter_reason(selecting, node("n", "s1", "b1", labels={"zone": "a"})) is None


def test_slots_are_the_fewest_pods_any_asked_resource_has_room_for() -> None:
    allocatable = {"cpu": 8000, GPU: 8000}
    assert fit.slots_in(allocatable, {}, {"cpu": 1000, GPU: 2000}) == 4
    assert fit.slots_in(allocatable, {GPU: 4000}, {"cpu": 1000, GPU: 2000}) == 2
    assert fit.slots_in(allocatable, {GPU: 3000}, {GPU: 2000}) == 2  # floor of 2.5
    assert fit.slots_in(allocatable, {GPU: 8000}, {GPU: 2000}) == 0
    assert fit.slots_in(allocatable, {GPU: 9000}, {GPU: 2000}) == 0  # overcommitted
    assert fit.slots_in(allocatable, {}, {"memory": 1}) == 0  # a resource the node lacks
    # What is not asked for is not counted; a request for nothing fits no pod.
    assert fit.slots_in(allocatable, {"cpu": 8000}, {"cpu": 0, GPU: 8000}) == 1
    assert fit.slots_in(allocatable, {}, {}) == 0
    assert fit.slots_in(allocatable, {}, {"cpu": 0}) == 0
    # At the edges: one milli-unit asked, one free; a resource nothing uses yet.
    assert fit.slots_in({"x": 5}, {}, {"x": 1}) == 5
    assert fit.slots_in({"x": 1}, {}, {"x": 1}) == 1
    assert fit.slots_in({GPU: 1999}, {}, {GPU: 1000}) == 1


def test_capacity_charges_every_pod_on_the_node() -> None:
    charged = [{GPU: 2000, "cpu": 500}, {GPU: 4000}]
    capacity = fit.capacity_of(node("n1", "s1", "b1"), charged)
    assert capacity.name == "n1"
    assert capacity.used == {GPU: 6000, "cpu": 500}
    assert capacity.free(GPU) == 2000
    assert capacity.free("cpu") == 7500
    assert capacity.free("example.com/none") == 0
    assert capacity.slots({GPU: 1000}) == 2


def test_offer_slots_lists_the_usable_nodes_that_take_at_least_one_pod() -> None:
    capacities = {
        "full": fit.capacity_of(node("full", "s1", "b1"), [{GPU: 8000}]),
        "half": fit.capacity_of(node("half", "s1", "b1"), [{GPU: 4000}]),
        "empty": fit.capacity_of(node("empty", "s1", "b1"), []),
    }
    usable = ["full", "half", "empty", "unknown"]
    assert fit.offer_slots(capacities, usable, {GPU: 2000}) == {"half": 2, "empty": 4}
    assert fit.offer_slots(capacities, ["empty"], {GPU: 2000}) == {"empty": 4}
    assert fit.offer_slots(capacities, usable, {GPU: 4000}) == {"half": 1, "empty": 2}


def test_node_facts_read_schedulable_and_tainted_once_per_version() -> None:
    ok = fit._read_node_facts(node("a", "s1", "b1", labels={"zone": "x"}))
    assert (ok.name, ok.schedulable, ok.tainted) == ("a", True, False)
    assert ok.labels["zone"] == "x"
    assert not fit._read_node_facts(node("b", "s1", "b1", ready=False)).schedulable
    assert not fit._read_node_facts(node("c", "s1", "b1", unschedulable=True)).schedulable
    tainted = node("d", "s1", "b1", taints=[{"key": "k", "effect": "NoSchedule"}])
    assert fit._read_node_facts(tainted).tainted
    bare = fit._read_node_facts({"metadata": None})
    assert (bare.name, dict(bare.labels), bare.tainted) == ("", {}, False)


def test_a_pods_request_is_shared_read_only_and_copied_for_a_caller_that_changes_it() -> None:
    one, two = pod("a", gpus=2, cpu="500m"), pod("b", gpus=2, cpu="500m")
    shared = fit.pod_request_shared(one)
    assert shared == {"cpu": 500, GPU: 2000, "pods": 1000}
    assert fit.pod_request_shared(two) is shared
    mine = fit.pod_request_milli(one)
    mine[GPU] = 0
    assert fit.pod_request_shared(one)[GPU] == 2000

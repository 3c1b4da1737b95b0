"""Rule 3's NodeSlices: at most 64 nodes each, nodes join and leave with their pods."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nodeset_controller.slices import SliceChange, plan_slices


def test_rule_nodeslice_new_nodes_fill_slices_of_64() -> None:
    nodes = [f"n{i:03d}" for i in range(130)]
    changes = plan_slices("gpu", {}, nodes)
    assert [(c.name, len(c.nodes), c.create) for c in changes] == [
        ("gpu-0", 64, True),
        ("gpu-1", 64, True),
        ("gpu-2", 2, True),
    ]


def test_rule_nodeslice_node_leaves_when_its_pod_is_removed() -> None:
    changes = plan_slices("gpu", {"gpu-0": ["a", "b", "c"]}, ["a", "c"])
    assert changes == [SliceChange("gpu-0", ("a", "c"), create=False)]


def test_rule_nodeslice_nodes_stay_in_their_slice_and_unchanged_slices_are_not_written() -> None:
    current = {"gpu-0": ["a"], "gpu-1": ["b"]}
    assert plan_slices("gpu", current, ["a", "b"]) == []
    changes = plan_slices("gpu", current, ["a", "b", "c"])
    assert changes == [SliceChange("gpu-0", ("a", "c"), create=False)]


@given(
    st.lists(st.text(alphabet="abcdefgh", min_size=1, max_size=3), max_size=200, unique=True),
    st.integers(min_value=1, max_value=10),
)
def test_rule_nodeslice_every_member_listed_once_within_capacity(
    members: list[str], capacity: int
) -> None:
    changes = plan_slices("s", {}, members, capacity)
    listed = [n for c in changes for n in c.nodes]
    assert sorted(listed) == sorted(members)
    assert all(len(c.nodes) <= capacity for c in changes)

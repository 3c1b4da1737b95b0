"""SharedCopies: one copy of each distinct value that many kept objects repeat."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodeflow_kube.projections import SharedCopies, items_key, json_key, share_parts


def test_rule_equal_mappings_share_the_first_copy() -> None:
    shared: SharedCopies[dict[str, int]] = SharedCopies(key=items_key)
    first = {"cpu": 100, "memory": 1024}
    second = {"memory": 1024, "cpu": 100}  # equal, built apart, other order
    assert shared.of(first) is first
    assert shared.of(second) is first
    assert shared.of({"cpu": 200}) is not first


def test_rule_hashable_values_are_their_own_key() -> None:
    shared: SharedCopies[frozenset[str]] = SharedCopies()
    first = frozenset({"cpu", "nvidia.com/gpu"})
    assert shared.of(frozenset(["nvidia.com/gpu", "cpu"])) is shared.of(first)


@given(st.lists(st.dictionaries(st.sampled_from("abc"), st.integers(0, 2)), max_size=40))
def test_rule_a_bounded_table_still_hands_out_equal_values(values: list[dict[str, int]]) -> None:
    """Past its limit the table starts over: whatever it hands out is equal to what was
    asked for, and never more distinct values are held than the limit."""
    shared: SharedCopies[dict[str, int]] = SharedCopies(key=items_key, limit=3)
    for value in values:
        assert shared.of(dict(value)) == value
        assert len(shared._copies) <= 3


def test_rule_share_parts_replaces_each_present_part_by_its_shared_copy() -> None:
    shared: SharedCopies[Any] = SharedCopies(key=json_key)
    paths = (("metadata", "labels"), ("spec", "containers"), ("status",), ("spec", "absent"))
    first = share_parts(
        {
            "metadata": {"name": "a", "labels": {"app": "x"}},
            "spec": {"containers": [{"name": "main"}]},
            "status": {"phase": "Running"},
        },
        paths,
        shared,
    )
    second = share_parts(
        {
            "metadata": {"name": "b", "labels": {"app": "x"}},
            "spec": {"containers": [{"name": "main"}]},
            "status": {"phase": "Pending"},
        },
        paths,
        shared,
    )
    assert second["metadata"]["labels"] is first["metadata"]["labels"]
    assert second["spec"]["containers"] is first["spec"]["containers"]
    assert second["status"] is not first["status"]  # another value: its own copy
    assert second["metadata"]["name"] == "b" and "absent" not in second["spec"]


def test_rule_share_parts_leaves_an_object_without_the_parents_as_it_is() -> None:
    shared: SharedCopies[Any] = SharedCopies(key=json_key)
    obj: dict[str, Any] = {"metadata": None, "spec": "not an object"}
    assert share_parts(obj, (("metadata", "labels"), ("spec", "containers")), shared) == {
        "metadata": None,
        "spec": "not an object",
    }

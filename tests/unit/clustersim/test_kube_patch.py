"""Patch algorithms: RFC 7386 laws, strategic merge keys/directives, RFC 6902."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clustersim.kube.errors import BadRequest, Invalid, UnsupportedMediaType
from clustersim.kube.patch import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    apply_patch,
    json_patch,
    merge_patch,
    result_is_fresh,
    strategic_merge_patch,
)

keys = st.sampled_from(["a", "b", "c", "d"])
scalars = st.one_of(st.integers(-5, 5), st.text(max_size=3), st.booleans())
documents = st.recursive(
    scalars, lambda children: st.dictionaries(keys, children, max_size=4), max_leaves=12
)
objects = st.dictionaries(keys, documents, max_size=4)
patches = st.recursive(
    st.one_of(scalars, st.none()),
    lambda children: st.dictionaries(keys, children, max_size=4),
    max_leaves=12,
)


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


@given(objects, patches)
def test_merge_patch_is_idempotent(target: dict[str, Any], patch: Any) -> None:
    once = merge_patch(target, patch)
    assert merge_patch(once, patch) == once


@given(objects)
def test_merge_patch_with_empty_object_is_identity(target: dict[str, Any]) -> None:
    assert merge_patch(target, {}) == target


@given(objects, objects)
def test_merge_patch_with_null_free_patch_contains_patch(
    target: dict[str, Any], patch: dict[str, Any]
) -> None:
    result = merge_patch(target, patch)
    for key, value in patch.items():
        if not isinstance(value, dict):
            assert result[key] == value


@given(objects, patches)
def test_merge_patch_does_not_mutate_inputs(target: dict[str, Any], patch: Any) -> None:
    before_target, before_patch = copy.deepcopy(target), copy.deepcopy(patch)
    merge_patch(target, patch)
    assert target == before_target and patch == before_patch


def _containers(value: Any) -> set[int]:
    found: set[int] = set()
    if isinstance(value, dict | list):
        found.add(id(value))
        for child in value.values() if isinstance(value, dict) else value:
            found |= _containers(child)
    return found


@given(
    objects,
    objects,
    st.sampled_from([JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH]),
    st.booleans(),
)
def test_a_result_said_fresh_shares_no_container_with_its_target(
    target: dict[str, Any], patch: dict[str, Any], patch_type: str, strategic: bool
) -> None:
    """The store skips copying a patch's result only when it owns every part of it."""
    if patch_type == STRATEGIC_MERGE_PATCH and not strategic:
        return  # refused for kinds without strategic merge
    body: Any = (
        [{"op": "add", "path": f"/{k}", "value": v} for k, v in patch.items()]
        if patch_type == JSON_PATCH
        else patch
    )
    result = apply_patch(target, body, patch_type, strategic=strategic)
    if result_is_fresh(patch_type, strategic=strategic):
        assert not _containers(result) & _containers(target)
        assert not _containers(result) & _containers(body)


@given(objects, patches)
def test_strategic_merge_equals_merge_patch_without_lists(
    target: dict[str, Any], patch: Any
) -> None:
    if isinstance(patch, dict):
        assert strategic_merge_patch(target, patch) == _without_nulls(merge_patch(target, patch))


def test_strategic_merge_merges_lists_by_patch_key() -> None:
    target = {
        "spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]},
        "metadata": {"finalizers": ["x"]},
    }
    patch = {
        "spec": {"containers": [{"name": "b", "image": "2"}, {"name": "c", "image": "3"}]},
        "metadata": {"finalizers": ["y", "x"]},
    }
    result = strategic_merge_patch(target, patch)
    assert result["spec"]["containers"] == [
        {"name": "a", "image": "1"},
        {"name": "b", "image": "2"},
        {"name": "c", "image": "3"},
    ]
    assert result["metadata"]["finalizers"] == ["x", "y"]


def test_strategic_merge_delete_and_replace_directives() -> None:
    target = {
        "spec": {
            "volumes": [{"name": "v1"}, {"name": "v2"}],
            "tolerations": [{"key": "a"}],
            "nodeSelector": {"x": "1", "y": "2"},
        }
    }
    patch = {
        "spec": {
            "volumes": [{"name": "v1", "$patch": "delete"}],
            "tolerations": [{"key": "b"}],
            "nodeSelector": {"$patch": "replace", "z": "3"},
        }
    }
    result = strategic_merge_patch(target, patch)
    assert result["spec"]["volumes"] == [{"name": "v2"}]
    assert result["spec"]["tolerations"] == [{"key": "b"}]
    assert result["spec"]["nodeSelector"] == {"z": "3"}


def test_strategic_merge_ignores_set_element_order_and_deletes_from_primitive_list() -> None:
    target = {"metadata": {"finalizers": ["a", "b", "c"]}, "spec": {"env": [{"name": "X"}]}}
    patch = {
        "metadata": {"$deleteFromPrimitiveList/finalizers": ["b"]},
        "spec": {"$setElementOrder/env": [{"name": "X"}], "env": [{"name": "X", "value": "1"}]},
    }
    result = strategic_merge_patch(target, patch)
    assert result["metadata"]["finalizers"] == ["a", "c"]
    assert result["spec"] == {"env": [{"name": "X", "value": "1"}]}


def test_strategic_merge_on_custom_resources_is_unsupported() -> None:
    with pytest.raises(UnsupportedMediaType):
        apply_patch({}, {}, STRATEGIC_MERGE_PATCH, strategic=False)


@given(objects, keys, documents)
def test_json_patch_add_then_remove_restores_document(
    target: dict[str, Any], key: str, value: Any
) -> None:
    if key in target:
        return
    added = json_patch(target, [{"op": "add", "path": f"/{key}", "value": value}])
    assert added[key] == value
    assert json_patch(added, [{"op": "remove", "path": f"/{key}"}]) == target


def test_json_patch_array_operations_and_escaping() -> None:
    doc = {"a/b": [1, 2, 3], "m~n": {}}
    result = json_patch(
        doc,
        [
            {"op": "add", "path": "/a~1b/-", "value": 4},
            {"op": "add", "path": "/a~1b/0", "value": 0},
            {"op": "move", "from": "/a~1b/1", "path": "/m~0n/moved"},
            {"op": "test", "path": "/a~1b", "value": [0, 2, 3, 4]},
        ],
    )
    assert result == {"a/b": [0, 2, 3, 4], "m~n": {"moved": 1}}


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "remove", "path": "/missing"}],
        [{"op": "replace", "path": "/list/0", "value": 1}],
        [{"op": "test", "path": "/a", "value": 2}],
        [{"op": "add", "path": "/list/9", "value": 1}],
    ],
)
def test_json_patch_failures_are_invalid(ops: list[dict[str, Any]]) -> None:
    with pytest.raises(Invalid):
        json_patch({"a": 1, "list": []}, ops)


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "bogus", "path": "/a"}],
        [{"op": "add", "path": "/a"}],  # no value
        [{"op": "move", "path": "/b"}],  # no from
        [{"op": "add", "path": "a", "value": 1}],  # not a JSON pointer
        [{"op": "add", "path": "/a/b", "value": 1}],  # into a number
        [{"op": "test", "path": "/a", "value": True}],  # true is not 1
    ],
)
def test_json_patch_operations_that_cannot_apply_are_invalid(ops: list[dict[str, Any]]) -> None:
    with pytest.raises(Invalid):
        json_patch({"a": 1, "list": []}, ops)


@pytest.mark.parametrize("body", [{"op": "add", "path": "/a", "value": 1}, ["add"], "x"])
def test_json_patch_body_that_is_not_a_list_of_operations_is_bad_request(body: Any) -> None:
    with pytest.raises(BadRequest):
        json_patch({"a": 1}, body)


@given(
    objects,
    st.lists(
        st.fixed_dictionaries(
            {
                "op": st.just("add"),
                "path": st.sampled_from(["/a", "/b/c", "/d"]),
                "value": documents,
            }
        ),
        max_size=3,
    ),
)
def test_json_patch_does_not_mutate_inputs(
    target: dict[str, Any], ops: list[dict[str, Any]]
) -> None:
    before_target, before_ops = copy.deepcopy(target), copy.deepcopy(ops)
    try:
        result = json_patch(target, ops)
    except Invalid:
        result = None
    assert target == before_target and ops == before_ops
    if result is not None and ops:
        assert result is not target


def test_json_patch_replace_of_a_missing_member_adds_it_as_kube_apiserver_does() -> None:
    ops = [{"op": "replace", "path": "/data/b", "value": "2"}]
    assert json_patch({"data": {"a": "1"}}, ops) == {"data": {"a": "1", "b": "2"}}


def test_json_patch_failing_late_applies_nothing() -> None:
    target = {"a": 1}
    ops = [{"op": "add", "path": "/b", "value": 2}, {"op": "test", "path": "/a", "value": 9}]
    with pytest.raises(Invalid):
        json_patch(target, ops)
    assert target == {"a": 1}

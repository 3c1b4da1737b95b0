"""Taints and tolerations (TaintToleration and NodeUnschedulable filters)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodeflow_kube.taints import (
    tolerates,
    tolerates_unschedulable,
    unschedulable_blocks,
    untolerated_taint,
)
from tests.unit.kube.builders import node

DEDICATED = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}


def test_toleration_matching() -> None:
    assert tolerates({"operator": "Exists"}, DEDICATED)
    assert not tolerates({"key": "dedicated", "value": "cpu"}, DEDICATED)
    assert tolerates({"key": "dedicated", "operator": "Equal", "value": "gpu"}, DEDICATED)
    assert tolerates({"key": "dedicated", "value": "gpu"}, DEDICATED)
    assert tolerates({"key": "dedicated", "operator": "Exists"}, DEDICATED)
    assert not tolerates({"key": "other", "operator": "Exists"}, DEDICATED)


def test_effect_must_match_unless_the_toleration_leaves_it_empty() -> None:
    assert tolerates({"operator": "Exists", "effect": "NoSchedule"}, DEDICATED)
    assert not tolerates({"operator": "Exists", "effect": "NoExecute"}, DEDICATED)
    assert not tolerates(
        {"key": "dedicated", "operator": "Exists", "effect": "PreferNoSchedule"}, DEDICATED
    )


def test_unknown_operator_tolerates_nothing() -> None:
    assert not tolerates({"key": "dedicated", "operator": "Gt", "value": "gpu"}, DEDICATED)
    assert not tolerates({"operator": "exists"}, DEDICATED)


def test_empty_key_with_equal_matches_any_key_with_that_value_as_toleratestaint_does() -> None:
    # The API server rejects such a toleration; ToleratesTaint itself only skips the key.
    assert tolerates({"value": "gpu"}, DEDICATED)
    assert not tolerates({"value": "cpu"}, DEDICATED)


def test_taints_and_tolerations() -> None:
    tainted = node(taints=[DEDICATED])
    assert untolerated_taint({}, tainted) == DEDICATED
    tolerate = {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
    assert untolerated_taint({"tolerations": [tolerate]}, tainted) is None
    soft = node(taints=[{"key": "x", "effect": "PreferNoSchedule"}])
    assert untolerated_taint({}, soft) is None


def test_untolerated_taint_only_looks_at_the_given_effects() -> None:
    evict = {"key": "bad", "effect": "NoExecute"}
    tainted = node(taints=[DEDICATED, evict])
    assert untolerated_taint({}, tainted, effects=("NoExecute",)) == evict
    tolerate_dedicated = {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}
    assert untolerated_taint(tolerate_dedicated, tainted) == evict


def test_unschedulable_node_needs_toleration() -> None:
    cordoned = node(unschedulable=True)
    assert unschedulable_blocks({}, cordoned)
    toleration = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}
    assert not unschedulable_blocks({"tolerations": [toleration]}, cordoned)
    assert tolerates_unschedulable({"tolerations": [{"operator": "Exists"}]})
    assert not tolerates_unschedulable(
        {"tolerations": [{"operator": "Exists", "effect": "NoExecute"}]}
    )
    assert not unschedulable_blocks({}, node())


keys = st.sampled_from(["k1", "k2"])
taint_values = st.sampled_from(["", "a", "b"])
effects = st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"])
taints = st.fixed_dictionaries({"key": keys, "value": taint_values, "effect": effects})
tolerations = st.fixed_dictionaries(
    {},
    optional={
        "key": st.one_of(st.just(""), keys),
        "operator": st.sampled_from(["", "Equal", "Exists"]),
        "value": taint_values,
        "effect": st.one_of(st.just(""), effects),
    },
)


@given(taints, st.one_of(st.just(""), effects))
def test_exists_without_key_tolerates_every_taint_of_its_effect(
    taint: dict[str, str], effect: str
) -> None:
    toleration = {"operator": "Exists", "effect": effect}
    assert tolerates(toleration, taint) == (effect in ("", taint["effect"]))


@given(taints)
def test_a_toleration_copied_from_a_taint_tolerates_it(taint: dict[str, str]) -> None:
    assert tolerates({**taint, "operator": "Equal"}, taint)
    assert tolerates({"key": taint["key"], "operator": "Exists"}, taint)


@given(tolerations, taints)
def test_a_named_effect_never_tolerates_another_effect(
    toleration: dict[str, str], taint: dict[str, str]
) -> None:
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        assert not tolerates(toleration, taint)


@given(tolerations, taints)
def test_a_named_key_never_tolerates_another_key(
    toleration: dict[str, str], taint: dict[str, str]
) -> None:
    if toleration.get("key") and toleration["key"] != taint["key"]:
        assert not tolerates(toleration, taint)


@given(st.lists(tolerations, max_size=3), st.lists(taints, max_size=4))
def test_prefer_no_schedule_never_blocks_and_the_blocker_is_untolerated(
    pod_tolerations: list[dict[str, str]], node_taints: list[dict[str, Any]]
) -> None:
    spec = {"tolerations": pod_tolerations}
    blocker = untolerated_taint(spec, node(taints=node_taints))
    if blocker is None:
        for taint in node_taints:
            if taint["effect"] != "PreferNoSchedule":
                assert any(tolerates(t, taint) for t in pod_tolerations)
    else:
        assert blocker["effect"] in ("NoSchedule", "NoExecute")
        assert not any(tolerates(t, blocker) for t in pod_tolerations)

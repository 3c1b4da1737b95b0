"""nodeSelector and required node affinity (the NodeAffinity filter)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeflow_kube.affinity import (
    node_affinity_matches,
    node_selector_matches,
    parse_int64,
    required_node_affinity_matches,
    requirement_matches,
    term_matches,
)
from tests.unit.kube.builders import expression, node, required


def test_match_expression_operators() -> None:
    assert requirement_matches({"operator": "In", "values": ["a", "b"]}, "a")
    assert not requirement_matches({"operator": "In", "values": ["a"]}, None)
    assert requirement_matches({"operator": "NotIn", "values": ["a"]}, None)
    assert not requirement_matches({"operator": "NotIn", "values": ["a"]}, "a")
    assert requirement_matches({"operator": "Exists"}, "")
    assert requirement_matches({"operator": "DoesNotExist"}, None)
    assert requirement_matches({"operator": "Gt", "values": ["3"]}, "4")
    assert not requirement_matches({"operator": "Gt", "values": ["3"]}, "3")
    assert requirement_matches({"operator": "Lt", "values": ["3"]}, "2")
    assert not requirement_matches({"operator": "Lt", "values": ["x"]}, "2")


@pytest.mark.parametrize(
    "requirement",
    [
        {"operator": "In", "values": []},
        {"operator": "NotIn"},
        {"operator": "Exists", "values": ["a"]},
        {"operator": "DoesNotExist", "values": ["a"]},
        {"operator": "Gt", "values": ["1", "2"]},
        {"operator": "Lt", "values": ["1.5"]},
        {"operator": "Gt", "values": [str(2**63)]},
        {"operator": "Like", "values": ["a"]},
    ],
)
def test_requirements_the_api_server_rejects_match_nothing(requirement: dict[str, Any]) -> None:
    for value in (None, "", "a", "1", "3"):
        assert not requirement_matches(requirement, value)


def test_gt_and_lt_parse_label_values_like_go() -> None:
    assert requirement_matches({"operator": "Gt", "values": ["-2"]}, "+1")
    assert not requirement_matches({"operator": "Gt", "values": ["1"]}, " 5")
    assert not requirement_matches({"operator": "Gt", "values": ["1"]}, "5_000")
    assert not requirement_matches({"operator": "Lt", "values": ["1"]}, None)
    assert parse_int64(str(2**63 - 1)) == 2**63 - 1
    assert parse_int64(str(-(2**63))) == -(2**63)
    assert parse_int64(str(2**63)) is None


def test_rule_node_selection_required_affinity_match_expressions() -> None:
    gpu = node("n1", labels={"gpu": "h100", "rack": "7"})
    cpu = node("n2", labels={"rack": "3"})
    spec = required(expression("gpu", "In", "h100"))
    assert node_affinity_matches(spec, gpu)
    assert not node_affinity_matches(spec, cpu)
    gt = required(expression("rack", "Gt", "5"))
    assert node_affinity_matches(gt, gpu) and not node_affinity_matches(gt, cpu)
    absent = required(expression("gpu", "DoesNotExist"))
    assert node_affinity_matches(absent, cpu) and not node_affinity_matches(absent, gpu)


def test_rule_node_selection_required_affinity_match_fields_metadata_name() -> None:
    spec = required(
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n2"]}]}
    )
    assert node_affinity_matches(spec, node("n1"))
    assert not node_affinity_matches(spec, node("n2"))


def test_match_fields_allow_only_metadata_name_in_or_not_in_one_value() -> None:
    n1 = node("n1")

    def fields(key: str, operator: str, *values: str) -> dict[str, Any]:
        return {"matchFields": [{"key": key, "operator": operator, "values": list(values)}]}

    assert term_matches(fields("metadata.name", "In", "n1"), n1)
    assert not term_matches(fields("metadata.name", "In", "n1", "n2"), n1)
    assert not term_matches(fields("metadata.namespace", "NotIn", "x"), n1)
    assert not term_matches(fields("metadata.name", "Exists"), n1)


def test_affinity_terms_are_ored_and_match_fields_by_name() -> None:
    n = node("n1", labels={"zone": "a"})
    by_name = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
    assert node_affinity_matches(required(*by_name), n)
    other = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]
    assert not node_affinity_matches(required(*other), n)
    either = [expression("zone", "In", "b"), expression("zone", "In", "a")]
    assert node_affinity_matches(required(*either), n)
    assert not node_affinity_matches(required({}), n)


def test_rule_node_selection_terms_are_ored_and_an_empty_term_matches_nothing() -> None:
    spec = required({}, expression("zone", "In", "b"))
    assert node_affinity_matches(spec, node("n1", labels={"zone": "b"}))
    assert not node_affinity_matches(spec, node("n1", labels={"zone": "a"}))
    assert not node_affinity_matches(required({}), node("n1"))


def test_a_required_selector_without_terms_matches_no_node() -> None:
    required_key = "requiredDuringSchedulingIgnoredDuringExecution"
    no_terms: dict[str, Any] = {"affinity": {"nodeAffinity": {required_key: {}}}}
    assert not required_node_affinity_matches(no_terms, node("n1"))
    assert not required_node_affinity_matches(required(), node("n1"))
    assert required_node_affinity_matches({}, node("n1"))
    assert required_node_affinity_matches({"affinity": {"nodeAffinity": {}}}, node("n1"))


def test_preferred_node_affinity_does_not_filter() -> None:
    spec = {
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "preference": expression("x", "Exists")}
                ]
            }
        }
    }
    assert node_affinity_matches(spec, node("n1"))


def test_node_selector() -> None:
    n = node("n1", labels={"pool": "gpu"})
    assert node_selector_matches({"nodeSelector": {"pool": "gpu"}}, n)
    assert not node_selector_matches({"nodeSelector": {"pool": "cpu"}}, n)
    assert not node_selector_matches({"nodeSelector": {"other": ""}}, n)
    assert not node_affinity_matches({"nodeSelector": {"pool": "cpu"}}, n)


def test_node_selector_and_affinity_must_both_hold() -> None:
    n = node("n1", labels={"pool": "gpu", "zone": "a"})
    spec = required(expression("zone", "In", "a"), nodeSelector={"pool": "gpu"})
    assert node_affinity_matches(spec, n)
    assert not node_affinity_matches(dict(spec, nodeSelector={"pool": "cpu"}), n)
    assert not node_affinity_matches(
        required(expression("zone", "In", "b"), nodeSelector={"pool": "gpu"}), n
    )


def test_malformed_fields_read_as_empty() -> None:
    weird: dict[str, Any] = {"affinity": "yes", "nodeSelector": ["pool"]}
    assert node_affinity_matches(weird, {"metadata": None})


values = st.sampled_from(["a", "b", "c"])
maybe_value = st.one_of(st.none(), values)


@given(st.lists(values, min_size=1, max_size=3), maybe_value)
def test_not_in_is_the_complement_of_in(listed: list[str], value: str | None) -> None:
    in_ = requirement_matches({"operator": "In", "values": listed}, value)
    not_in = requirement_matches({"operator": "NotIn", "values": listed}, value)
    assert in_ != not_in


@given(maybe_value)
def test_does_not_exist_is_the_complement_of_exists(value: str | None) -> None:
    exists = requirement_matches({"operator": "Exists"}, value)
    assert exists != requirement_matches({"operator": "DoesNotExist"}, value)
    assert exists == (value is not None)


@given(st.integers(-100, 100), st.integers(-100, 100))
def test_gt_and_lt_compare_integers(label: int, bound: int) -> None:
    assert requirement_matches({"operator": "Gt", "values": [str(bound)]}, str(label)) == (
        label > bound
    )
    assert requirement_matches({"operator": "Lt", "values": [str(bound)]}, str(label)) == (
        label < bound
    )


@given(
    st.dictionaries(st.sampled_from(["zone", "pool"]), values, max_size=2),
    st.lists(
        st.builds(expression, st.sampled_from(["zone", "pool"]), st.just("In"), values),
        min_size=1,
        max_size=3,
    ),
)
def test_terms_are_ored(labels: dict[str, str], terms: list[dict[str, Any]]) -> None:
    n = node("n1", labels=labels)
    assert node_affinity_matches(required(*terms), n) == any(term_matches(t, n) for t in terms)


def test_rule_a_gt_or_lt_bound_below_int64_is_rejected_and_matches_nothing() -> None:
    """Go's ParseInt fails one below int64's minimum as it does one above its maximum: the API
    server rejects such a Gt/Lt requirement, so it matches no node, while the minimum itself
    is a bound like any other."""
    below = str(-(2**63) - 1)
    assert parse_int64(below) is None
    assert not requirement_matches({"operator": "Gt", "values": [below]}, "0")
    assert requirement_matches({"operator": "Gt", "values": [str(-(2**63))]}, "0")
    assert not requirement_matches({"operator": "Lt", "values": ["0"]}, below)


@pytest.mark.parametrize("operator", ["Exists", "DoesNotExist", "Gt", "Lt", "Equal", ""])
def test_rule_match_fields_with_any_operator_but_in_or_not_in_match_nothing(
    operator: str,
) -> None:
    """The API server accepts only In and NotIn in matchFields: metadata.name with one value
    and another operator is a term the scheduler cannot parse, so it matches no node, not
    even the one it names; In with that value matches it."""
    term = {"matchFields": [{"key": "metadata.name", "operator": operator, "values": ["n1"]}]}
    assert not term_matches(term, node("n1"))
    assert not term_matches(term, node("n2"))
    named = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    assert term_matches(named, node("n1"))

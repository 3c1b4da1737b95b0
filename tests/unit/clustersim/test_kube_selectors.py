"""Label/field selector parsing and matching."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clustersim.kube.errors import BadRequest
from clustersim.kube.selectors import LabelSelector, parse_field_selector, parse_label_selector

label_keys = st.sampled_from(["app", "tier", "example.com/role", "env"])
label_values = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?", fullmatch=True)
label_sets = st.dictionaries(label_keys, label_values, max_size=4)
requirements = st.one_of(
    st.tuples(label_keys, st.sampled_from(["=", "==", "!="]), label_values).map(
        lambda t: f"{t[0]}{t[1]}{t[2]}"
    ),
    st.tuples(
        label_keys, st.sampled_from(["in", "notin"]), st.lists(label_values, min_size=1, max_size=3)
    ).map(lambda t: f"{t[0]} {t[1]} ({','.join(t[2])})"),
    label_keys,
    label_keys.map(lambda k: f"!{k}"),
)


@given(st.lists(requirements, min_size=1, max_size=4), label_sets)
def test_selector_round_trips_through_its_string_form(
    parts: list[str], labels: dict[str, str]
) -> None:
    selector = parse_label_selector(",".join(parts))
    reparsed = parse_label_selector(selector.to_string())
    assert reparsed == selector
    assert reparsed.matches(labels) == selector.matches(labels)


@given(st.lists(requirements, min_size=1, max_size=4), label_sets)
def test_selector_is_conjunction_of_its_requirements(
    parts: list[str], labels: dict[str, str]
) -> None:
    whole = parse_label_selector(",".join(parts)).matches(labels)
    each = all(parse_label_selector(p).matches(labels) for p in parts)
    assert whole == each


@given(label_sets)
def test_empty_selector_matches_everything(labels: dict[str, str]) -> None:
    assert parse_label_selector("").matches(labels)


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("app=web", {"app": "web"}, True),
        ("app==web", {"app": "db"}, False),
        ("app!=web", {}, True),
        ("app in (web, db)", {"app": "db"}, True),
        ("app notin (web)", {"app": "web"}, False),
        ("app notin (web)", {}, True),
        ("app", {"app": ""}, True),
        ("!app", {"app": "x"}, False),
        ("app=web,tier in (a,b)", {"app": "web", "tier": "b"}, True),
    ],
)
def test_label_selector_operators(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_label_selector(selector).matches(labels) is expected


@pytest.mark.parametrize("bad", ["app in (web", "=web", "app=we b", "bad key=1", ","])
def test_malformed_label_selectors_are_bad_requests(bad: str) -> None:
    with pytest.raises(BadRequest):
        parse_label_selector(bad)


def test_match_labels_and_expressions() -> None:
    selector = LabelSelector.from_match(
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a"]},
                {"key": "legacy", "operator": "DoesNotExist"},
            ],
        }
    )
    assert selector.matches({"app": "web", "tier": "a"})
    assert not selector.matches({"app": "web", "tier": "a", "legacy": "1"})
    assert LabelSelector.from_match({}).matches({"anything": "x"})


def test_field_selectors() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"nodeName": "n1", "unschedulable": True},
        "status": {"phase": "Running"},
    }
    assert parse_field_selector("spec.nodeName=n1,status.phase==Running").matches(pod)
    assert parse_field_selector("spec.nodeName!=n2").matches(pod)
    assert not parse_field_selector("metadata.namespace=other").matches(pod)
    assert parse_field_selector("spec.unschedulable=true").matches(pod)
    assert parse_field_selector("spec.missing=").matches(pod)
    with pytest.raises(BadRequest):
        parse_field_selector("spec.nodeName")

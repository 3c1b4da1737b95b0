"""Label selectors as Kubernetes reads them (nodeflow_kube.labels): the string grammar of
apimachinery's labels.Parse, shared by the emulator's list requests and the
maintenance-scheduler's podSelectors, and the metav1.LabelSelector object form."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeflow_kube.labels import LabelSelector, SelectorError, parse_label_selector


def test_rule_label_selector_forms() -> None:
    selector = parse_label_selector("app=x, tier!=db, env in (a,b), !legacy, team")
    assert selector.matches({"app": "x", "env": "a", "team": "t"})
    assert not selector.matches({"app": "x", "env": "c", "team": "t"})
    assert not selector.matches({"app": "x", "env": "a", "team": "t", "legacy": "1"})
    assert parse_label_selector("").matches({})
    assert parse_label_selector("app==x").matches({"app": "x"})


def test_rule_whitespace_between_tokens_is_free() -> None:
    """`app in(a,b)` is valid for kubectl and the API server: no space is needed."""
    for text in ("app in(a,b)", "app in (a, b)", " app  in  ( a ,b ) ", "app notin(c)"):
        selector = parse_label_selector(text)
        assert selector.matches({"app": "a"}), text
    assert parse_label_selector("app=x,tier!=db") == parse_label_selector("app = x , tier != db")


def test_rule_greater_and_less_than_compare_integers() -> None:
    """`gpu-count>0` is a requirement on the label's integer value, not a key named so."""
    more = parse_label_selector("gpu-count>0")
    assert more.matches({"gpu-count": "8"})
    assert not more.matches({"gpu-count": "0"})
    assert not more.matches({"gpu-count": "many"}) and not more.matches({})
    assert parse_label_selector("gpu-count<2").matches({"gpu-count": "1"})
    with pytest.raises(SelectorError):
        parse_label_selector("gpu-count>many")


def test_rule_empty_values_are_values() -> None:
    assert parse_label_selector("app=").matches({"app": ""})
    assert not parse_label_selector("app=").matches({})
    assert parse_label_selector("app in ()").matches({"app": ""})


@pytest.mark.parametrize(
    "text",
    [
        "app=(",
        "app in a,b",
        "app in (a",
        "=x",
        "app=x=y",
        "a b",
        "app in (a b)",
        "-bad=x",
        "!",
        "in=foo",
        "notin",
        "!in",
    ],
)
def test_rule_a_selector_that_does_not_parse_is_refused(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_label_selector(text)


def test_rule_the_object_form_reads_match_labels_and_expressions() -> None:
    selector = LabelSelector.from_match(
        {
            "matchLabels": {"app": "train"},
            "matchExpressions": [
                {"key": "tier", "operator": "NotIn", "values": ["db"]},
                {"key": "legacy", "operator": "DoesNotExist"},
            ],
        }
    )
    assert selector.matches({"app": "train", "tier": "web"})
    assert not selector.matches({"app": "train", "legacy": "1"})
    with pytest.raises(SelectorError):
        LabelSelector.from_match({"matchExpressions": [{"key": "a", "operator": "Gt"}]})


@pytest.mark.parametrize(
    "selector",
    [
        "app=x",
        {"matchLabels": ["app", "x"]},
        {"matchExpressions": {"key": "a", "operator": "Exists"}},
        {"matchExpressions": ["a"]},
        {"matchExpressions": [{"key": "a", "operator": "In", "values": "ab"}]},
    ],
)
def test_rule_an_object_form_of_the_wrong_shape_is_refused(selector: object) -> None:
    """The one reader of metav1.LabelSelector objects refuses what it cannot read (the
    placer's preemption then counts the budget as guarding nothing, as before) instead of
    failing with an AttributeError, or reading "ab" as the values "a" and "b"."""
    with pytest.raises(SelectorError):
        LabelSelector.from_match(selector)


LABEL_KEYS = st.sampled_from(["app", "tier", "nvidia.com/gpu.product", "team"])
LABEL_VALUES = st.sampled_from(["", "a", "b", "x-1", "H100"])


@given(
    st.lists(
        st.tuples(LABEL_KEYS, st.sampled_from(["=", "!=", "in", "notin", "", "!"]), LABEL_VALUES),
        min_size=1,
        max_size=4,
    ),
    st.dictionaries(LABEL_KEYS, LABEL_VALUES),
)
def test_rule_a_selector_reads_back_from_its_string_form(
    parts: list[tuple[str, str, str]], labels: dict[str, str]
) -> None:
    """Written out and read again, a selector means the same."""
    texts = []
    for key, operator, value in parts:
        if operator in ("=", "!="):
            texts.append(f"{key}{operator}{value}")
        elif operator in ("in", "notin"):
            texts.append(f"{key} {operator} ({value},b)")
        else:
            texts.append(f"{operator}{key}")
    selector = parse_label_selector(",".join(texts))
    again = parse_label_selector(selector.to_string())
    assert again == selector
    assert again.matches(labels) == selector.matches(labels)


def test_rule_integers_and_whitespace_are_read_as_go_reads_them() -> None:
    """A bound is a label value and an int64 (no sign, no digit separators, no overflow); a
    label compared with it must read as Go's ParseInt reads it; only ASCII blanks separate
    tokens (a no-break space is part of the key, which makes it invalid)."""
    for text in ("a>-1", "a>1_0", "a>99999999999999999999", "a\u00a0=b"):
        with pytest.raises(SelectorError):
            parse_label_selector(text)
    assert not parse_label_selector("a>5").matches({"a": "1_0"})
    assert parse_label_selector("a>5").matches({"a": "10"})
    assert parse_label_selector("a\t=\tb").matches({"a": "b"})

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


def test_rule_a_bound_and_a_label_value_are_read_as_int64() -> None:
    """Go's ParseInt(text, 10, 64): 2**63-1 is the largest bound a selector takes and 2**63
    is refused; a label value outside int64 (either side) never compares, one on its edge
    does."""
    largest, smallest = 2**63 - 1, -(2**63)
    assert parse_label_selector(f"a<{largest}").matches({"a": str(largest - 1)})
    with pytest.raises(SelectorError):
        parse_label_selector(f"a>{largest + 1}")
    below = parse_label_selector("a<0")
    assert below.matches({"a": str(smallest)})
    assert not below.matches({"a": str(smallest - 1)})
    above = parse_label_selector("a>0")
    assert above.matches({"a": str(largest)})
    assert not above.matches({"a": str(largest + 1)})


def test_rule_greater_and_less_than_are_strict() -> None:
    """`a>3` and `a<3` do not match a = 3, as the API server reads them."""
    assert not parse_label_selector("a<3").matches({"a": "3"})
    assert not parse_label_selector("a>3").matches({"a": "3"})
    assert parse_label_selector("a<3").matches({"a": "2"})
    assert parse_label_selector("a>3").matches({"a": "4"})


@pytest.mark.parametrize("text", ["a>3", "a<3", "a=3", "a!=3", "a in (3,4)", "a", "!a"])
def test_rule_every_operator_is_written_back_as_it_was_read(text: str) -> None:
    """The string form of a selector (a list request's labelSelector) is the text it was read
    from, `>` and `<` included, and reads back to the same selector."""
    selector = parse_label_selector(text)
    assert selector.to_string() == text
    assert parse_label_selector(selector.to_string()) == selector


def test_rule_an_object_without_labels_matches_as_one_with_none() -> None:
    """`matches(None)` (an object whose metadata has no labels) is `matches({})`: only the
    requirements an absent label meets hold."""
    assert parse_label_selector("!legacy,tier!=db").matches(None)
    assert not parse_label_selector("app=x").matches(None)
    assert not parse_label_selector("app").matches(None)


def test_rule_only_a_selector_without_requirements_is_empty() -> None:
    """The emulator's list and watch skip the label match for an empty selector only."""
    assert parse_label_selector("").empty and parse_label_selector(None).empty
    assert LabelSelector.from_match({}).empty
    assert not parse_label_selector("app=x").empty
    assert not LabelSelector.from_match({"matchLabels": {"app": "x"}}).empty


def test_rule_the_object_form_may_carry_only_labels_or_only_expressions() -> None:
    """matchLabels and matchExpressions are each optional; a missing or null one adds no
    requirement."""
    only_labels = LabelSelector.from_match({"matchLabels": {"app": "x"}, "matchExpressions": None})
    assert only_labels.matches({"app": "x"}) and not only_labels.matches({"app": "y"})
    only_expressions = LabelSelector.from_match(
        {"matchLabels": None, "matchExpressions": [{"key": "app", "operator": "Exists"}]}
    )
    assert only_expressions.matches({"app": "y"}) and not only_expressions.matches({})
    assert LabelSelector.from_match({"matchExpressions": []}).empty


def test_rule_a_label_key_is_a_qualified_name() -> None:
    """As apimachinery's IsQualifiedName: a name of at most 63 characters, and an optional
    DNS-subdomain prefix of at most 253 characters before a "/"."""
    name63, prefix253 = "n" * 63, ".".join(["p" * 63] * 3) + "." + "p" * 61
    assert len(prefix253) == 253
    for key in (name63, f"{prefix253}/{name63}", "nvidia.com/gpu.product"):
        assert parse_label_selector(f"{key}=x").matches({key: "x"}), key
    for key in ("n" * 64, f"{prefix253}p/name", "Upper.Case/name", "bad_prefix/name", "/name"):
        with pytest.raises(SelectorError):
            parse_label_selector(f"{key}=x")


def test_rule_a_label_value_has_at_most_63_characters() -> None:
    value = "v" * 63
    assert parse_label_selector(f"a={value}").matches({"a": value})
    assert parse_label_selector(f"a in ({value})").matches({"a": value})
    for text in (f"a={value}v", f"a in ({value}v)", f"a>{'1' * 64}"):
        with pytest.raises(SelectorError):
            parse_label_selector(text)


def test_rule_an_empty_place_in_a_value_set_is_the_empty_value() -> None:
    """As Go's parser: `in (,b)` and `in (b,)` hold "" and "b"."""
    for text in ("a in (,b)", "a in (b,)"):
        selector = parse_label_selector(text)
        assert selector.requirements[0].values == ("", "b"), text
        assert selector.matches({"a": ""}) and selector.matches({"a": "b"}), text
    assert parse_label_selector("a in (b)").requirements[0].values == ("b",)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("app=x,", "expected a label key but found 'the end'"),
        ("app in (a),=x", "expected a label key but found '='"),
        ("app=(", "expected a label value but found '('"),
        ("app>", "expected an integer but found 'the end'"),
    ],
)
def test_rule_a_refused_selector_says_what_it_found(text: str, says: str) -> None:
    """The error names the token the grammar did not expect (or the end of the text), so
    whoever wrote the podSelector sees where it went wrong."""
    with pytest.raises(SelectorError) as refused:
        parse_label_selector(text)
    assert says in str(refused.value)

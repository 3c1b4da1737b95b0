"""CEL through cel-expr-python, and the CRD rule walker (x-kubernetes-validations)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from clustersim.kube.cel import CelCompileError, CelEvalError, compile_rule
from clustersim.kube.crd_rules import compile_errors, rule_causes


@pytest.mark.parametrize(
    ("rule", "self_value", "old", "expected"),
    [
        ("self == oldSelf", "a", "a", True),
        ("self == oldSelf", "a", "b", False),
        ("self == oldSelf", {"x": [1, 2]}, {"x": [1, 2]}, True),
        ("self == oldSelf", 1, True, False),  # no bool/int confusion
        ("self == oldSelf", 1, 1.0, True),  # numbers compare across int/double
        ("self != oldSelf", 2, 1, True),
        ("self >= oldSelf", 2, 1, True),
        ("has(self.a) && self.a.b == 'x'", {"a": {"b": "x"}}, None, True),
        ("!has(self.a) || self.a > 3", {}, None, True),
        ("size(self) <= 2 && self.size() == 2", [1, 2], None, True),
        ("self.all(x, x.startsWith('gpu-'))", ["gpu-1", "gpu-2"], None, True),
        ("self.exists(x, x.endsWith('-2'))", ["gpu-1", "gpu-2"], None, True),
        ("self.exists_one(x, x == 1)", [1, 1], None, False),
        ("self.matches('^[a-z]+$')", "abc", None, True),
        ("self.contains('b')", "abc", None, True),
        ("self in ['a', 'b']", "c", None, False),
        ("'k' in self", {"k": 1}, None, True),
        ("self.min <= self.max ? true : false", {"min": 1, "max": 2}, None, True),
        ("-7 / 2 == -3 && -7 % 2 == -1 && 2 * 3 + 1 == 7", None, None, True),
        ("int('12') + 1 == 13 && string(5) == '5' && double(1) == 1.0", None, None, True),
        ("self[0] == 'a' && self[1] == \"b\"", ["a", "b"], None, True),
        ("self['key'] == r'raw\\n'", {"key": "raw\\n"}, None, True),
        ("{'a': 1}['a'] == 1 && [1, 2] + [3] == [1, 2, 3]", None, None, True),
        # an error on one side of || is absorbed when the other side decides
        ("self.missing == 1 || true", {}, None, True),
        # the strings extension and optional types of kube-apiserver's environment
        (
            "'%s-%d'.format([self.a, 2]) == 'x-2' && ['a', 'b'].join('-') == 'a-b'",
            {"a": "x"},
            None,
            True,
        ),
        ("self.lowerAscii().split(',') == ['a', 'b']", "A,B", None, True),
        ("self.?missing.orValue(3) == 3", {}, None, True),
        ("self.map(x, x * 2).filter(x, x > 2) == [4]", [1, 2], None, True),
        (
            "duration('1h') > duration('59m') "
            "&& timestamp(self) < timestamp('2030-01-01T00:00:00Z')",
            "2026-01-01T00:00:00Z",
            None,
            True,
        ),
    ],
)
def test_expressions_evaluate(rule: str, self_value: Any, old: Any, expected: bool) -> None:
    assert compile_rule(rule).evaluate({"self": self_value, "oldSelf": old}) is expected


@pytest.mark.parametrize(
    ("rule", "self_value", "message"),
    [
        ("self.missing == 1", {}, "no such key: missing"),
        ("self.a < 'x'", {"a": 1}, "no such overload"),
        ("self[3] == 1", [1], "index '3' out of range in list size '1'"),
        ("1 / self == 1", 0, "division by zero"),
        ("size(self) == 1", 5, "no such overload"),
    ],
)
def test_runtime_errors_use_kube_apiserver_wording(
    rule: str, self_value: Any, message: str
) -> None:
    with pytest.raises(CelEvalError) as raised:
        compile_rule(rule).evaluate({"self": self_value, "oldSelf": None})
    assert str(raised.value).startswith(message), raised.value


@pytest.mark.parametrize(
    "rule",
    [
        "self ==",
        "quantity(self).isGreaterThan(quantity('1'))",
        "self.isSorted()",
        "other == 1",
        "has(self)",
        "self.x @ 1",
        "",
    ],
)
def test_unsupported_expressions_fail_to_compile(rule: str) -> None:
    with pytest.raises(CelCompileError):
        compile_rule(rule)


def test_compile_errors_carry_the_library_message_without_status_codes() -> None:
    with pytest.raises(CelCompileError) as raised:
        compile_rule("self.min <")
    message = str(raised.value)
    assert message.startswith("ERROR: <input>:1:11: Syntax error: mismatched input '<EOF>'")
    assert "INVALID_ARGUMENT" not in message
    with pytest.raises(CelCompileError, match="undeclared reference to 'quantity'"):
        compile_rule("quantity(self) == quantity('1')")


def test_variables_mark_transition_rules() -> None:
    assert compile_rule("self == oldSelf").variables == {"self", "oldSelf"}
    assert compile_rule("self.all(x, x > 0)").variables == {"self"}
    # a macro variable is not the oldSelf of a transition rule
    assert compile_rule("self.all(old, old > 0)").variables == {"self"}


def test_result_types_are_checked_at_compile_time() -> None:
    assert compile_rule("self == oldSelf").result_type == "bool"
    assert compile_rule("self.x").result_type == "dyn"
    assert compile_rule("'min %d'.format([self.min])").result_type == "string"
    assert compile_rule("size(self)").result_type == "int"


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "node": {
                    "type": "string",
                    "x-kubernetes-validations": [
                        {"rule": "self == oldSelf", "message": "Value is immutable"}
                    ],
                },
                "count": {
                    "type": "integer",
                    "x-kubernetes-validations": [{"rule": "self < 10"}],
                },
                "labels": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "string",
                        "x-kubernetes-validations": [
                            {
                                "rule": "self == oldSelf",
                                "reason": "FieldValueForbidden",
                                "message": "label values are fixed",
                            }
                        ],
                    },
                },
                "tags": {
                    "type": "array",
                    "items": {
                        "type": "string",
                        "x-kubernetes-validations": [
                            {"rule": "size(self) > 0", "messageExpression": "'empty tag'"}
                        ],
                    },
                },
            },
        }
    },
}


def _obj(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"}, "spec": spec}


def test_transition_rules_only_on_update() -> None:
    assert rule_causes(_obj({"node": "a"}), None, SCHEMA) == []
    causes = rule_causes(_obj({"node": "b"}), _obj({"node": "a"}), SCHEMA)
    assert [(c.reason, c.field, c.message) for c in causes] == [
        ("FieldValueInvalid", "spec.node", 'Invalid value: "b": Value is immutable')
    ]
    assert rule_causes(_obj({"node": "a"}), _obj({"node": "a"}), SCHEMA) == []
    assert rule_causes(_obj({"node": "a"}), _obj({}), SCHEMA) == []


def test_plain_rules_ratchet_unchanged_values() -> None:
    bad = _obj({"count": 12})
    [cause] = rule_causes(bad, None, SCHEMA)
    assert cause.message == "Invalid value: 12: failed rule: self < 10"
    assert rule_causes(bad, bad, SCHEMA) == []  # unchanged on update: not re-validated
    assert len(rule_causes(_obj({"count": 13}), bad, SCHEMA)) == 1


def test_map_values_correlate_by_key_and_reason_is_honoured() -> None:
    old = _obj({"labels": {"a": "1", "b": "2"}})
    new = _obj({"labels": {"a": "1", "b": "3", "c": "4"}})
    causes = rule_causes(new, old, SCHEMA)
    assert [(c.reason, c.field, c.message) for c in causes] == [
        ("FieldValueForbidden", "spec.labels[b]", "Forbidden: label values are fixed")
    ]


def test_message_expression_and_item_paths() -> None:
    causes = rule_causes(_obj({"tags": ["x", ""]}), None, SCHEMA)
    assert [(c.field, c.message) for c in causes] == [
        ("spec.tags[1]", 'Invalid value: "": empty tag')
    ]


def test_compile_errors_name_the_rule() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "x-kubernetes-validations": [{"rule": "self.x.exists_two(y, y)"}],
                "properties": {
                    "items": {
                        "type": "array",
                        "items": {
                            "type": "string",
                            "x-kubernetes-validations": [{"rule": "self == oldSelf"}],
                        },
                    }
                },
            }
        },
    }
    causes = compile_errors(schema, "spec.versions[0].schema.openAPIV3Schema")
    fields = [c.field for c in causes]
    spec = "spec.versions[0].schema.openAPIV3Schema.properties[spec]"
    assert fields == [
        f"{spec}.properties[items].items.x-kubernetes-validations[0].rule",
        f"{spec}.x-kubernetes-validations[0].rule",
    ]
    assert causes[0].message == (
        'Invalid value: "self == oldSelf": oldSelf cannot be used on the uncorrelatable '
        f"portion of the schema within {spec}.properties[items]"
    )
    assert "exists_two" in causes[1].message
    assert compile_errors(SCHEMA, "s") == []


def test_structural_errors_hide_compilation_errors() -> None:
    schema = {
        "type": "object",
        "x-kubernetes-validations": [{"rule": "self.min <"}, {"rule": "true", "reason": "Bogus"}],
    }
    [cause] = compile_errors(schema, "s")
    assert (cause.field, cause.reason) == (
        "s.x-kubernetes-validations[1].reason",
        "FieldValueNotSupported",
    )


def test_rule_that_is_not_a_bool_is_refused_at_crd_write() -> None:
    schema = {
        "type": "object",
        "x-kubernetes-validations": [
            {
                "rule": "size(self)",
                "messageExpression": "size(self)",
                "reason": "FieldValueForbidden",
            }
        ],
    }
    rule = (
        '{"Rule":"size(self)","Message":"","MessageExpression":"size(self)",'
        '"Reason":"FieldValueForbidden","FieldPath":"","OptionalOldSelf":null}'
    )
    causes = compile_errors(schema, "s")
    assert [(c.field, c.message) for c in causes] == [
        (
            "s.x-kubernetes-validations[0].rule",
            f"Invalid value: {rule}: cel expression must evaluate to a bool",
        ),
        (
            "s.x-kubernetes-validations[0].messageExpression",
            f"Invalid value: {rule}: messageExpression must evaluate to a string",
        ),
    ]


def test_number_values_are_doubles_in_rules() -> None:
    schema = {
        "type": "object",
        "properties": {
            "ratio": {"type": "number", "x-kubernetes-validations": [{"rule": "self + 0.5 <= 1.5"}]}
        },
    }
    # JSON's 1 is an int in Python; the schema makes it a double, so double + double applies.
    assert rule_causes({"ratio": 1}, None, schema) == []
    [cause] = rule_causes({"ratio": 2}, None, schema)
    assert cause.message == "Invalid value: 2: failed rule: self + 0.5 <= 1.5"


def test_runtime_error_names_the_schema_type_and_rule() -> None:
    schema = {"type": "object", "x-kubernetes-validations": [{"rule": "self.missing == 1"}]}
    [cause] = rule_causes({"present": 1}, None, schema)
    assert cause.message == (
        'Invalid value: "object": no such key: missing evaluating rule: self.missing == 1'
    )


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=2)),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=2), children, max_size=3)
    ),
    max_leaves=8,
)


def _same_json(a: Any, b: Any) -> bool:
    """Structural equality that, unlike Python's ==, tells true from 1."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@given(json_values, json_values)
@example({"": 1, "\x00": 1}, {"": 1, "\x00": 1})
@example("a", "a\x00")
def test_immutable_field_rule_refuses_every_change(old: Any, new: Any) -> None:
    """``self == oldSelf`` (the project CRDs' immutable fields) passes exactly when the value
    is unchanged, whatever its shape; and ratcheting never skips a changed value."""
    schema = {
        "type": "object",
        "properties": {
            "field": {
                "x-kubernetes-preserve-unknown-fields": True,
                "x-kubernetes-validations": [{"rule": "self == oldSelf"}],
            }
        },
    }
    causes = rule_causes({"field": new}, {"field": old}, schema)
    assert (causes == []) == _same_json(old, new)


@pytest.mark.parametrize(
    ("rule", "self_value", "expected"),
    [
        ("self == oldSelf", {"": 1, "\x00": 2}, True),
        ("self", {"a\x00b": "x\x00y"}, {"a\x00b": "x\x00y"}),
        ("size(self)", "x\x00y", 3),
        ("self[1]", ["a", "\x00"], "\x00"),
        ("self == 'a'", "a\x00", False),
    ],
)
def test_nul_in_strings_and_keys_is_kept_as_kube_apiserver_keeps_it(
    rule: str, self_value: Any, expected: Any
) -> None:
    """JSON allows NUL in strings and keys, and cel-go keeps it; the C++ library would cut the
    string there (two keys becoming one, "a\\x00" equal to "a")."""
    assert compile_rule(rule).evaluate({"self": self_value, "oldSelf": self_value}) == expected

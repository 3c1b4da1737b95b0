"""The CEL subset evaluator and the CRD rule walker (x-kubernetes-validations)."""

from __future__ import annotations

from typing import Any

import pytest

from clustersim.kube.cel import CelEvalError, CelUnsupported, compile_rule
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
    ],
)
def test_expressions_evaluate(rule: str, self_value: Any, old: Any, expected: bool) -> None:
    assert compile_rule(rule).evaluate({"self": self_value, "oldSelf": old}) is expected


@pytest.mark.parametrize(
    ("rule", "self_value"),
    [
        ("self.missing == 1", {}),
        ("self.a < 'x'", {"a": 1}),
        ("self[3] == 1", [1]),
        ("1 / self == 1", 0),
        ("size(self) == 1", 5),
    ],
)
def test_runtime_errors(rule: str, self_value: Any) -> None:
    with pytest.raises(CelEvalError):
        compile_rule(rule).evaluate({"self": self_value, "oldSelf": None})


@pytest.mark.parametrize(
    "rule",
    [
        "self ==",
        "quantity(self).isGreaterThan(quantity('1'))",
        "self.optMap(x, x)",
        "other == 1",
        "has(self)",
        "self.x @ 1",
        "",
    ],
)
def test_unsupported_expressions_fail_to_compile(rule: str) -> None:
    with pytest.raises(CelUnsupported):
        compile_rule(rule)


def test_variables_mark_transition_rules() -> None:
    assert compile_rule("self == oldSelf").variables == {"self", "oldSelf"}
    assert compile_rule("self.all(x, x > 0)").variables == {"self"}


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
    assert fields == [
        "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule",
        "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[items].items"
        ".x-kubernetes-validations[0].rule",
    ]
    assert "exists_two" in causes[0].message
    assert "uncorrelatable" in causes[1].message
    assert compile_errors(SCHEMA, "s") == []

"""CRD ``x-kubernetes-validations`` (CEL rules), enforced the way kube-apiserver 1.32 does.

* ``compile_errors(schema, path)`` checks every rule of a CRD version's schema when the CRD is
  written; a rule the CEL library (see ``clustersim.kube.cel``) cannot compile, or whose result
  is not a bool, is refused with a 422 cause naming the rule, never silently skipped.
* ``rule_causes(new, old, schema)`` evaluates the rules on a custom object write.  ``self`` is
  the value at the schema node that declares the rule; rules are skipped where the value is
  absent; values of ``type: number`` nodes are doubles, as in kube-apiserver.  Transition rules
  (those reading ``oldSelf``) run only on update, and only where the old value correlates
  (object properties, map keys, ``x-kubernetes-list-type: map`` items).  Rules without
  ``oldSelf`` whose value did not change on update are not re-checked (validation ratcheting,
  on by default since 1.30).
* A failed rule becomes a cause at the node's field path (plus the rule's ``fieldPath``) with
  the rule's ``reason`` (default ``FieldValueInvalid``) and ``messageExpression``, ``message``
  or ``failed rule: <rule>`` as detail.  As kube-apiserver 1.36 does, the cause shows the
  value that failed (``Invalid value: "node-b": ...``, numbers and booleans bare) unless it is
  an object or a list (``Invalid value: ...``); a rule that cannot be evaluated still names the
  schema type (``Invalid value: "string": ... evaluating rule``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from clustersim.kube.cel import CelCompileError, CelEvalError, Compiled, compile_rule
from clustersim.kube.errors import Cause

Schema = dict[str, Any]
_ABSENT = object()
_REASONS = ("FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate")
_FIELD_PATH_RE = re.compile(r"\.([A-Za-z0-9_\-$]+)|\['([^']*)'\]")


# --------------------------------------------------------------------------- CRD write


def compile_errors(schema: Schema, path: str) -> list[Cause]:
    """Causes for every rule in ``schema`` (at CRD field ``path``) that cannot be enforced.
    As kube-apiserver, a schema with structural errors in its rules (an unsupported
    ``reason``, a rule without ``rule``) gets no CEL compilation errors, only the structural
    ones and ``oldSelf`` used where nothing correlates."""
    found = _Found([], [], [])
    _compile_node(schema, path, None, found)
    if found.structural:
        return found.structural + found.uncorrelated
    return found.uncorrelated + found.compilation


@dataclass(frozen=True)
class _Found:
    structural: list[Cause]
    uncorrelated: list[Cause]
    compilation: list[Cause]


def _compile_node(schema: Schema, path: str, uncorrelatable_at: str | None, causes: _Found) -> None:
    """``uncorrelatable_at`` is the path of the list above ``schema`` whose items have no old
    value to compare with (any list but ``x-kubernetes-list-type: map``), if there is one."""
    if not isinstance(schema, dict):
        return
    for i, rule in enumerate(schema.get("x-kubernetes-validations") or []):
        _compile_one(rule, f"{path}.x-kubernetes-validations[{i}]", uncorrelatable_at, causes)
    for name, sub in (schema.get("properties") or {}).items():
        _compile_node(sub, f"{path}.properties[{name}]", uncorrelatable_at, causes)
    additional = schema.get("additionalProperties")
    if isinstance(additional, dict):
        _compile_node(additional, f"{path}.additionalProperties", uncorrelatable_at, causes)
    items = schema.get("items")
    if isinstance(items, dict):
        if uncorrelatable_at is None and schema.get("x-kubernetes-list-type") != "map":
            uncorrelatable_at = path
        _compile_node(items, f"{path}.items", uncorrelatable_at, causes)


def _compile_one(rule: Any, path: str, uncorrelatable_at: str | None, found: _Found) -> None:
    if not isinstance(rule, dict) or not isinstance(rule.get("rule"), str):
        found.structural.append(Cause("FieldValueRequired", "Required value", f"{path}.rule"))
        return
    reason = rule.get("reason")
    if reason is not None and reason not in _REASONS:
        supported = ", ".join(f'"{r}"' for r in sorted(_REASONS))
        found.structural.append(
            Cause(
                "FieldValueNotSupported",
                f'Unsupported value: "{reason}": supported values: {supported}',
                f"{path}.reason",
            )
        )
    source = rule["rule"]
    shown = _rule_value(rule)
    causes = found.compilation
    try:
        compiled = compile_rule(source)
    except CelCompileError as exc:
        causes.append(_invalid(f"{path}.rule", shown, f"compilation failed: {exc}"))
        return
    if compiled.result_type not in ("bool", "dyn"):
        causes.append(_invalid(f"{path}.rule", shown, "cel expression must evaluate to a bool"))
    if "oldSelf" in compiled.variables and uncorrelatable_at is not None:
        why = "oldSelf cannot be used on the uncorrelatable portion of the schema within"
        found.uncorrelated.append(
            _invalid(f"{path}.rule", _go_json(source), f"{why} {uncorrelatable_at}")
        )
    if rule.get("optionalOldSelf"):
        causes.append(
            _invalid(
                f"{path}.optionalOldSelf",
                shown,
                "optionalOldSelf is not supported by clustersim (it would bind oldSelf to "
                "an optional value on create)",
            )
        )
    expression = rule.get("messageExpression")
    if isinstance(expression, str):
        _compile_message_expression(expression, shown, f"{path}.messageExpression", causes)


def _compile_message_expression(
    expression: str, shown: str, path: str, causes: list[Cause]
) -> None:
    try:
        compiled = compile_rule(expression)
    except CelCompileError as exc:
        causes.append(_invalid(path, shown, f"messageExpression compilation failed: {exc}"))
        return
    if compiled.result_type not in ("string", "dyn"):
        causes.append(_invalid(path, shown, "messageExpression must evaluate to a string"))


def _go_json(value: Any) -> str:
    """``value`` as Go's encoding/json writes it (compact, HTML characters escaped)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _rule_value(rule: dict[str, Any]) -> str:
    """The invalid value kube-apiserver shows for a rule that cannot be compiled: the whole
    rule, as Go's JSON of its ValidationRule struct."""
    return _go_json(
        {
            "Rule": rule.get("rule", ""),
            "Message": rule.get("message", ""),
            "MessageExpression": rule.get("messageExpression", ""),
            "Reason": rule.get("reason"),
            "FieldPath": rule.get("fieldPath", ""),
            "OptionalOldSelf": rule.get("optionalOldSelf"),
        }
    )


def _invalid(path: str, shown: str, why: str) -> Cause:
    return Cause("FieldValueInvalid", f"Invalid value: {shown}: {why}", path)


# --------------------------------------------------------------------------- object write


def rule_causes(new: Any, old: Any, schema: Schema) -> list[Cause]:
    """Causes for every rule ``new`` breaks; ``old`` is the stored object (None on create)."""
    causes: list[Cause] = []
    _check(new, _ABSENT if old is None else old, schema, "", causes)
    return causes


def _check(value: Any, old: Any, schema: Schema, path: str, causes: list[Cause]) -> None:
    if not isinstance(schema, dict):
        return
    rules = schema.get("x-kubernetes-validations")
    if rules:
        _apply_rules(value, old, schema, rules, path, causes)
    if isinstance(value, dict):
        props: dict[str, Schema] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        old_map = old if isinstance(old, dict) else {}
        for key, item in value.items():
            sub = props.get(key)
            if sub is None and isinstance(additional, dict):
                sub = additional
                child_path = f"{path}[{key}]"
            else:
                child_path = f"{path}.{key}" if path else key
            if sub is not None:
                _check(item, old_map.get(key, _ABSENT), sub, child_path, causes)
    elif isinstance(value, list):
        items = schema.get("items")
        if not isinstance(items, dict):
            return
        keys = schema.get("x-kubernetes-list-map-keys") or []
        keyed = schema.get("x-kubernetes-list-type") == "map" and keys
        old_by_key: dict[tuple[Any, ...], Any] = {}
        if keyed and isinstance(old, list):
            for element in old:
                if isinstance(element, dict):
                    old_by_key[tuple(repr(element.get(k)) for k in keys)] = element
        for i, element in enumerate(value):
            previous: Any = _ABSENT
            if keyed and isinstance(element, dict):
                previous = old_by_key.get(tuple(repr(element.get(k)) for k in keys), _ABSENT)
            _check(element, previous, items, f"{path}[{i}]", causes)


def _apply_rules(
    value: Any, old: Any, schema: Schema, rules: list[Any], path: str, causes: list[Cause]
) -> None:
    type_name = str(schema.get("type", ""))
    env = {"self": _as_cel(value, schema), "oldSelf": None}
    if old is not _ABSENT:
        env["oldSelf"] = _as_cel(old, schema)
    unchanged = old is not _ABSENT and _equal(env)
    for rule in rules:
        compiled = compile_rule(rule["rule"])
        transition = "oldSelf" in compiled.variables
        if transition and old is _ABSENT:
            continue
        if not transition and unchanged:
            continue  # ratcheting: an unchanged value is not re-validated
        field = _field_path(path, rule.get("fieldPath"))
        try:
            result = compiled.evaluate(env)
        except CelEvalError as exc:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f'Invalid value: "{type_name}": {exc} evaluating rule: {rule["rule"].strip()}',
                    field,
                )
            )
            continue
        if result is True:
            continue
        if not isinstance(result, bool):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f'Invalid value: "{type_name}": rule did not evaluate to a bool: '
                    f"{rule['rule'].strip()}",
                    field,
                )
            )
            continue
        causes.append(_failure(rule, env, type_name, field))


def _equal(env: dict[str, Any]) -> bool:
    """CEL's equality of ``self`` and ``oldSelf`` (no bool/int confusion, ``1 == 1.0``)."""
    try:
        return compile_rule("self == oldSelf").evaluate(env) is True
    except CelEvalError:
        return False  # a value CEL cannot hold is never taken as unchanged


def _as_cel(value: Any, schema: Schema) -> Any:
    """``value`` as kube-apiserver hands it to CEL: integers at ``type: number`` nodes are
    doubles (JSON does not tell ``1`` from ``1.0``; the schema does)."""
    if not isinstance(schema, dict):
        return value
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict):
        props: dict[str, Schema] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        fallback: Schema = additional if isinstance(additional, dict) else {}
        return {key: _as_cel(item, props.get(key, fallback)) for key, item in value.items()}
    if isinstance(value, list):
        items = schema.get("items")
        return [_as_cel(item, items) for item in value] if isinstance(items, dict) else value
    return value


def _detail(rule: dict[str, Any], env: dict[str, Any]) -> str:
    expression = rule.get("messageExpression")
    if isinstance(expression, str):
        compiled: Compiled = compile_rule(expression)
        try:
            message = compiled.evaluate(env)
        except CelEvalError:
            message = None
        if isinstance(message, str) and message.strip() and "\n" not in message:
            return message
    message = rule.get("message")
    if isinstance(message, str) and message:
        return message
    return f"failed rule: {rule['rule'].strip()}"


def _bad_value(kind: str, value: Any, type_name: str) -> str:
    """apimachinery's field.Error rendering of a failed rule's value: objects and lists are
    omitted, strings quoted, numbers and booleans bare, anything else as JSON."""
    if type_name in ("object", "array"):
        return kind
    if isinstance(value, bool):
        return f"{kind}: {'true' if value else 'false'}"
    if isinstance(value, int):
        return f"{kind}: {value}"
    if isinstance(value, float):
        return f"{kind}: {int(value) if value.is_integer() else value}"
    return f"{kind}: {json.dumps(value, separators=(',', ':'))}"


def _failure(rule: dict[str, Any], env: dict[str, Any], type_name: str, field: str) -> Cause:
    detail = _detail(rule, env)
    reason = rule.get("reason") or "FieldValueInvalid"
    value = env["self"]
    if reason == "FieldValueForbidden":
        return Cause(reason, f"Forbidden: {detail}", field)
    if reason == "FieldValueRequired":
        return Cause(reason, f"Required value: {detail}", field)
    if reason == "FieldValueDuplicate":
        return Cause(reason, _bad_value("Duplicate value", value, type_name), field)
    return Cause(
        "FieldValueInvalid", f"{_bad_value('Invalid value', value, type_name)}: {detail}", field
    )


def _field_path(path: str, relative: Any) -> str:
    if not isinstance(relative, str) or not relative:
        return path
    out = path
    for name, quoted in _FIELD_PATH_RE.findall(relative):
        part = name or quoted
        out = f"{out}.{part}" if out else part
    return out

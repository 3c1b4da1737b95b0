"""Structural-schema handling for custom resources, as the apiserver does it on write:
prune unknown fields, apply ``default`` values, then validate (types, required, enum,
minimum/maximum, length, pattern, items, int-or-string, preserve-unknown-fields).  Errors are
``Cause`` objects with the apiserver's field paths (``spec.replicas``, ``spec.items[0].name``).
"""

from __future__ import annotations

import copy
import re
from functools import lru_cache
from typing import Any

from clustersim.kube.errors import Cause

Schema = dict[str, Any]
_ROOT_KEEP = ("apiVersion", "kind", "metadata")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _preserves(schema: Schema) -> bool:
    return bool(schema.get("x-kubernetes-preserve-unknown-fields"))


def prune(value: Any, schema: Schema, *, root: bool = False) -> Any:
    """Drop object fields the schema does not declare (returns a new value)."""
    if isinstance(value, dict):
        props: dict[str, Schema] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        embedded = root or bool(schema.get("x-kubernetes-embedded-resource"))
        out: dict[str, Any] = {}
        for key, item in value.items():
            if embedded and key in _ROOT_KEEP:
                out[key] = item
            elif key in props:
                out[key] = prune(item, props[key])
            elif isinstance(additional, dict):
                out[key] = prune(item, additional)
            elif additional is True or _preserves(schema):
                out[key] = item
        return out
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            return [prune(v, items) for v in value]
    return value


def apply_defaults(value: Any, schema: Schema) -> Any:
    """Fill missing properties that declare ``default`` (recursively, in place on a copy)."""
    if isinstance(value, dict):
        props: dict[str, Schema] = schema.get("properties") or {}
        for key, sub in props.items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(value[key], sub)
        additional = schema.get("additionalProperties")
        if isinstance(additional, dict):
            for key in list(value):
                if key not in props:
                    value[key] = apply_defaults(value[key], additional)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            return [apply_defaults(v, items) for v in value]
    return value


@lru_cache(maxsize=512)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_ok(value: Any, expected: str) -> bool:
    actual = _type_name(value)
    if expected == "number":
        return actual in ("integer", "number")
    return actual == expected


def _render(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return f'"{_type_name(value)}"'
    return str(value)


def validate(value: Any, schema: Schema, path: str = "") -> list[Cause]:
    """All schema violations of ``value`` as causes with field paths."""
    causes: list[Cause] = []
    _validate(value, schema, path, causes)
    return causes


def _validate(value: Any, schema: Schema, path: str, causes: list[Cause]) -> None:
    if value is None:
        if not schema.get("nullable") and schema.get("type"):
            causes.append(
                Cause(
                    "FieldValueTypeInvalid",
                    f'Invalid value: "null": {path or "<root>"} '
                    f'in body must be of type {schema.get("type")}: "null"',
                    path,
                )
            )
        return
    int_or_string = bool(schema.get("x-kubernetes-int-or-string"))
    if int_or_string and (not isinstance(value, int | str) or isinstance(value, bool)):
        causes.append(
            Cause(
                "FieldValueTypeInvalid",
                f"Invalid value: {_render(value)}: {path} in body must be of type "
                f"integer,string: {_render(_type_name(value))}",
                path,
            )
        )
        return
    expected = schema.get("type")
    if expected and not _type_ok(value, expected):
        causes.append(
            Cause(
                "FieldValueTypeInvalid",
                f"Invalid value: {_render(_type_name(value))}: {path} in body must be of type "
                f"{expected}: {_render(_type_name(value))}",
                path,
            )
        )
        return
    _validate_scalar(value, schema, path, causes)
    if isinstance(value, dict):
        _validate_object(value, schema, path, causes)
    elif isinstance(value, list):
        _validate_array(value, schema, path, causes)
    for sub in schema.get("allOf") or []:
        _validate(value, sub, path, causes)
    any_of = schema.get("anyOf")
    if any_of and not any(not validate(value, s, path) for s in any_of):
        causes.append(Cause("FieldValueInvalid", "Invalid value: must match anyOf", path))
    one_of = schema.get("oneOf")
    if one_of and sum(1 for s in one_of if not validate(value, s, path)) != 1:
        causes.append(
            Cause("FieldValueInvalid", "Invalid value: must match exactly one of oneOf", path)
        )


def _validate_scalar(value: Any, schema: Schema, path: str, causes: list[Cause]) -> None:
    enum = schema.get("enum")
    if enum is not None and value not in enum:
        supported = ", ".join(_render(e) for e in enum)
        causes.append(
            Cause(
                "FieldValueNotSupported",
                f"Unsupported value: {_render(value)}: supported values: {supported}",
                path,
            )
        )
    if isinstance(value, int | float) and not isinstance(value, bool):
        minimum = schema.get("minimum")
        if minimum is not None:
            if schema.get("exclusiveMinimum") and value <= minimum:
                causes.append(
                    Cause(
                        "FieldValueInvalid",
                        f"Invalid value: {value}: {path} in body should be greater than {minimum}",
                        path,
                    )
                )
            elif value < minimum:
                causes.append(
                    Cause(
                        "FieldValueInvalid",
                        f"Invalid value: {value}: {path} in "
                        f"body should be greater than or equal to {minimum}",
                        path,
                    )
                )
        maximum = schema.get("maximum")
        if maximum is not None:
            if schema.get("exclusiveMaximum") and value >= maximum:
                causes.append(
                    Cause(
                        "FieldValueInvalid",
                        f"Invalid value: {value}: {path} in body should be less than {maximum}",
                        path,
                    )
                )
            elif value > maximum:
                causes.append(
                    Cause(
                        "FieldValueInvalid",
                        f"Invalid value: {value}: {path} in "
                        f"body should be less than or equal to {maximum}",
                        path,
                    )
                )
    if isinstance(value, str):
        max_len = schema.get("maxLength")
        if max_len is not None and len(value) > max_len:
            causes.append(
                Cause("FieldValueTooLong", f"Too long: may not be more than {max_len} bytes", path)
            )
        min_len = schema.get("minLength")
        if min_len is not None and len(value) < min_len:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {_render(value)}: {path} "
                    f"in body should be at least {min_len} chars long",
                    path,
                )
            )
        pattern = schema.get("pattern")
        if pattern is not None and not _compiled(pattern).search(value):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {_render(value)}: {path} in body should match '{pattern}'",
                    path,
                )
            )


def _validate_object(value: dict[str, Any], schema: Schema, path: str, causes: list[Cause]) -> None:
    for key in schema.get("required") or []:
        if key not in value:
            causes.append(Cause("FieldValueRequired", "Required value", _join(path, key)))
    props: dict[str, Schema] = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    for key, item in value.items():
        if not path and key in _ROOT_KEEP:
            continue
        if key in props:
            _validate(item, props[key], _join(path, key), causes)
        elif isinstance(additional, dict):
            _validate(item, additional, _join(path, key), causes)
    max_props = schema.get("maxProperties")
    if max_props is not None and len(value) > max_props:
        causes.append(
            Cause("FieldValueTooMany", f"Too many: must have at most {max_props} items", path)
        )


def _validate_array(value: list[Any], schema: Schema, path: str, causes: list[Cause]) -> None:
    max_items = schema.get("maxItems")
    if max_items is not None and len(value) > max_items:
        causes.append(
            Cause(
                "FieldValueTooMany",
                f"Too many: {len(value)}: must have at most {max_items} items",
                path,
            )
        )
    min_items = schema.get("minItems")
    if min_items is not None and len(value) < min_items:
        causes.append(
            Cause(
                "FieldValueInvalid",
                f"Invalid value: {len(value)}: {path} in body "
                f"should have at least {min_items} items",
                path,
            )
        )
    items = schema.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(value):
            _validate(item, items, f"{path}[{i}]", causes)


def prepare_custom_object(
    obj: dict[str, Any], schema: Schema
) -> tuple[dict[str, Any], list[Cause]]:
    """Prune, default and validate a whole custom object; returns (new object, causes)."""
    if not schema:
        return obj, []
    pruned = prune(obj, schema, root=True)
    defaulted = apply_defaults(pruned, schema)
    return defaulted, validate(defaulted, schema)

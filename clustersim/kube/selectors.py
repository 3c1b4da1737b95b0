"""Label and field selectors with the apiserver's syntax.

Label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x,y)``, ``a`` (exists),
``!a`` (does not exist), comma-separated (AND).  Field selectors: ``path=value``,
``path==value``, ``path!=value`` over dotted paths such as ``metadata.name`` or ``spec.nodeName``.
``LabelSelector.from_match`` converts a ``metav1.LabelSelector`` dict (matchLabels /
matchExpressions) as used by PodDisruptionBudgets and Jobs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clustersim.kube.errors import BadRequest

_KEY_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # one of: =, !=, in, notin, exists, !exists
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        if op == "exists":
            return self.key in labels
        if op == "!exists":
            return self.key not in labels
        if op in ("=", "in"):
            return self.key in labels and labels[self.key] in self.values
        # != and notin match objects without the label too, like the apiserver.
        return self.key not in labels or labels[self.key] not in self.values


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements

    def equality_value(self, key: str) -> str | None:
        for r in self.requirements:
            if r.key == key and r.operator == "=" and len(r.values) == 1:
                return r.values[0]
        return None

    @staticmethod
    def parse(text: str | None) -> LabelSelector:
        return parse_label_selector(text)

    @staticmethod
    def from_match(selector: Mapping[str, Any] | None) -> LabelSelector:
        """From a ``metav1.LabelSelector`` dict; ``None`` or ``{}`` selects everything."""
        if not selector:
            return LabelSelector()
        reqs: list[Requirement] = [
            Requirement(str(k), "=", (str(v),))
            for k, v in (selector.get("matchLabels") or {}).items()
        ]
        op_names = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
        for expr in selector.get("matchExpressions") or []:
            op = op_names.get(str(expr.get("operator")))
            if op is None:
                raise BadRequest(f"invalid label selector operator {expr.get('operator')!r}")
            reqs.append(Requirement(str(expr["key"]), op, tuple(expr.get("values") or ())))
        return LabelSelector(tuple(reqs))

    def to_string(self) -> str:
        parts = []
        for r in self.requirements:
            if r.operator == "exists":
                parts.append(r.key)
            elif r.operator == "!exists":
                parts.append("!" + r.key)
            elif r.operator in ("=", "!="):
                parts.append(f"{r.key}{r.operator}{r.values[0]}")
            else:
                parts.append(f"{r.key} {r.operator} ({','.join(r.values)})")
        return ",".join(parts)


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise BadRequest(f"unable to parse requirement: unbalanced ')' in {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise BadRequest(f"unable to parse requirement: unbalanced '(' in {text!r}")
    parts.append("".join(current))
    return parts


def _check_key(key: str, text: str) -> str:
    if not _KEY_RE.match(key) or len(key.split("/")[-1]) > 63:
        raise BadRequest(f"unable to parse requirement: invalid label key {key!r} in {text!r}")
    return key


def _check_value(value: str, text: str) -> str:
    if len(value) > 63 or not _VALUE_RE.match(value):
        raise BadRequest(f"unable to parse requirement: invalid label value {value!r} in {text!r}")
    return value


_SET_RE = re.compile(r"^\s*(\S+)\s+(in|notin)\s*\((.*)\)\s*$")


def _parse_requirement(part: str, text: str) -> Requirement:
    stripped = part.strip()
    if not stripped:
        raise BadRequest(f"unable to parse requirement: empty requirement in {text!r}")
    set_match = _SET_RE.match(stripped)
    if set_match:
        key, op, raw_values = set_match.groups()
        values = tuple(sorted({_check_value(v.strip(), text) for v in raw_values.split(",")}))
        return Requirement(_check_key(key, text), op, values)
    for symbol, op in (("!=", "!="), ("==", "="), ("=", "=")):
        if symbol in stripped:
            key, _, value = stripped.partition(symbol)
            return Requirement(
                _check_key(key.strip(), text), op, (_check_value(value.strip(), text),)
            )
    if stripped.startswith("!"):
        return Requirement(_check_key(stripped[1:].strip(), text), "!exists")
    return Requirement(_check_key(stripped, text), "exists")


def parse_label_selector(text: str | None) -> LabelSelector:
    if text is None or not text.strip():
        return LabelSelector()
    return LabelSelector(tuple(_parse_requirement(p, text) for p in _split_top_level(text)))


@dataclass(frozen=True)
class FieldRequirement:
    path: str
    value: str
    negate: bool

    def matches(self, obj: Mapping[str, Any]) -> bool:
        actual = field_value(obj, self.path)
        return (actual != self.value) if self.negate else (actual == self.value)


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all(r.matches(obj) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements

    def equality_value(self, path: str) -> str | None:
        for r in self.requirements:
            if r.path == path and not r.negate:
                return r.value
        return None

    @staticmethod
    def parse(text: str | None) -> FieldSelector:
        return parse_field_selector(text)


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string form of a dotted field the way the apiserver's field sets render it."""
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, Mapping):
            return ""
        current = current.get(part)
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)


def parse_field_selector(text: str | None) -> FieldSelector:
    if text is None or not text.strip():
        return FieldSelector()
    reqs: list[FieldRequirement] = []
    for part in text.split(","):
        stripped = part.strip()
        for symbol, negate in (("!=", True), ("==", False), ("=", False)):
            if symbol in stripped:
                path, _, value = stripped.partition(symbol)
                if not path.strip():
                    raise BadRequest(f"invalid field selector {text!r}")
                reqs.append(FieldRequirement(path.strip(), value.strip(), negate))
                break
        else:
            raise BadRequest(f"invalid selector: '{text}'; can't understand '{stripped}'")
    return FieldSelector(tuple(reqs))

"""Label and field selectors with the apiserver's syntax.

Label selectors are nodeflow_kube.labels' (the grammar of apimachinery's `labels.Parse`, and
`LabelSelector.from_match` for a `metav1.LabelSelector` object), with a selector that does
not parse refused as the API server refuses it (400 Bad Request). Field selectors:
``path=value``, ``path==value``, ``path!=value`` over dotted paths such as ``metadata.name``
or ``spec.nodeName``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clustersim.kube.errors import BadRequest
from nodeflow_kube.labels import LabelSelector, SelectorError
from nodeflow_kube.labels import parse_label_selector as parse_labels

__all__ = [
    "FieldRequirement",
    "FieldSelector",
    "LabelSelector",
    "field_value",
    "parse_field_selector",
    "parse_label_selector",
    "selector_from_match",
]


def parse_label_selector(text: str | None) -> LabelSelector:
    """The label selector of a request; BadRequest when it does not parse."""
    try:
        return parse_labels(text)
    except SelectorError as exc:
        raise BadRequest(str(exc)) from exc


def selector_from_match(selector: Mapping[str, Any] | None) -> LabelSelector:
    """A `metav1.LabelSelector` object's selector; BadRequest for an unknown operator."""
    try:
        return LabelSelector.from_match(selector)
    except SelectorError as exc:
        raise BadRequest(str(exc)) from exc


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

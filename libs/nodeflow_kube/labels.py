"""Label selectors as Kubernetes reads them: the string form (`kubectl -l`, a NodeMaintenance's
podSelector, a list request's `labelSelector`) and the `metav1.LabelSelector` object form
(matchLabels / matchExpressions, as PodDisruptionBudgets and Skyhooks carry them).

The string grammar is the one of k8s.io/apimachinery's `labels.Parse`: comma-separated
requirements (AND), each `key`, `!key`, `key=value`, `key==value`, `key!=value`,
`key in (a,b)`, `key notin (a,b)`, `key>3` or `key<3`. Whitespace between tokens is free
(`app in(a,b)` reads like `app in (a, b)`), an empty value is a value (`key=`, `key in ()`),
keys are qualified names and values label values, and `>`/`<` take an integer. Anything else
raises SelectorError naming what is wrong, never a selector that means something else.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

Operator = Literal["=", "!=", "in", "notin", "exists", "!exists", "gt", "lt"]

# A label key: an optional DNS-subdomain prefix and "/", then a name of at most 63 characters.
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
# The lexer's tokens: the operators (longest first), parentheses, commas, and identifiers,
# which run until whitespace or one of those characters.
_TOKEN = re.compile(r"[ \t\r\n]*(!=|==|=|!|>|<|\(|\)|,|[^ \t\r\n!=<>(),]+)")
# What Go's strconv.ParseInt(text, 10, 64) reads: the bound of `>`/`<` (a label value too,
# so unsigned) and the label values compared with it.
_INTEGER = re.compile(r"[+-]?[0-9]+")
_INT64 = range(-(2**63), 2**63)
_OBJECT_OPERATORS: Mapping[str, Operator] = {
    "In": "in",
    "NotIn": "notin",
    "Exists": "exists",
    "DoesNotExist": "!exists",
}


class SelectorError(ValueError):
    """A selector Kubernetes would refuse."""


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        if op == "exists":
            return self.key in labels
        if op == "!exists":
            return self.key not in labels
        if op in ("gt", "lt"):
            have = parse_int64(labels.get(self.key))
            bound = parse_int64(self.values[0])
            if have is None or bound is None:
                return False
            return have > bound if op == "gt" else have < bound
        if op in ("=", "in"):
            return self.key in labels and labels[self.key] in self.values
        # != and notin match objects without the label too, as the API server does.
        return self.key not in labels or labels[self.key] not in self.values

    def to_string(self) -> str:
        if self.operator == "exists":
            return self.key
        if self.operator == "!exists":
            return "!" + self.key
        if self.operator in ("=", "!="):
            return f"{self.key}{self.operator}{self.values[0]}"
        if self.operator in ("gt", "lt"):
            return f"{self.key}{'>' if self.operator == 'gt' else '<'}{self.values[0]}"
        return f"{self.key} {self.operator} ({','.join(self.values)})"


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        found = labels or {}
        return all(r.matches(found) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements

    def to_string(self) -> str:
        return ",".join(r.to_string() for r in self.requirements)

    @staticmethod
    def from_match(selector: object) -> LabelSelector:
        """From a `metav1.LabelSelector` object; None or {} selects everything. The one reader
        of that form (PodDisruptionBudgets in the emulator and the placer's preemption,
        Skyhooks' podNonInterruptLabels): a part of the wrong shape or an operator the object
        form does not have raises SelectorError."""
        if not selector:
            return LabelSelector()
        if not isinstance(selector, Mapping):
            raise SelectorError(f"a label selector is an object, not {selector!r}")
        match_labels = selector.get("matchLabels") or {}
        expressions = selector.get("matchExpressions") or []
        if not isinstance(match_labels, Mapping):
            raise SelectorError(f"matchLabels is an object, not {match_labels!r}")
        if not isinstance(expressions, list):
            raise SelectorError(f"matchExpressions is a list, not {expressions!r}")
        requirements = [
            Requirement(str(key), "=", (str(value),)) for key, value in match_labels.items()
        ]
        for expression in expressions:
            if not isinstance(expression, Mapping):
                raise SelectorError(f"a matchExpressions entry is an object, not {expression!r}")
            operator = _OBJECT_OPERATORS.get(str(expression.get("operator")))
            if operator is None:
                raise SelectorError(
                    f"invalid label selector operator {expression.get('operator')!r}"
                )
            values = expression.get("values") or []
            if not isinstance(values, list):
                raise SelectorError(f"matchExpressions values are a list, not {values!r}")
            requirements.append(
                Requirement(str(expression.get("key")), operator, tuple(str(v) for v in values))
            )
        return LabelSelector(tuple(requirements))


def parse_label_selector(text: str | None) -> LabelSelector:
    """The selector `text` says; None or blank selects everything."""
    if text is None or not text.strip(" \t\r\n"):
        return LabelSelector()
    return LabelSelector(tuple(_Parser(text).requirements()))


def parse_int64(text: str | None) -> int | None:
    """`text` as Go's strconv.ParseInt(text, 10, 64) reads it, None where that fails (Python's
    int() would also take "1_0" or " 1")."""
    if text is None or not _INTEGER.fullmatch(text):
        return None
    value = int(text)
    return value if value in _INT64 else None


def check_key(key: str, text: str) -> str:
    prefix, slash, name = key.rpartition("/")
    if (
        not name
        or len(name) > 63
        or not _NAME.fullmatch(name)
        or (slash and (not prefix or len(prefix) > 253 or not _PREFIX.fullmatch(prefix)))
    ):
        raise SelectorError(f"invalid label key {key!r} in selector {text!r}")
    return key


def check_value(value: str, text: str) -> str:
    if len(value) > 63 or not _VALUE.fullmatch(value):
        raise SelectorError(f"invalid label value {value!r} in selector {text!r}")
    return value


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = list(_tokens(text))
        self.at = 0

    def _peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _take(self) -> str | None:
        token = self._peek()
        self.at += 1
        return token

    def _fail(self, what: str) -> SelectorError:
        return SelectorError(f"unable to parse requirement: {what} in selector {self.text!r}")

    def requirements(self) -> Iterator[Requirement]:
        while True:
            yield self._requirement()
            token = self._take()
            if token is None:
                return
            if token != ",":
                raise self._fail(f"expected ',' but found {token!r}")

    def _identifier(self, what: str) -> str:
        token = self._take()
        if token is None or token in ("!", "!=", "=", "==", ">", "<", "(", ")", ","):
            raise self._fail(f"expected {what} but found {token or 'the end'!r}")
        return token

    def _key(self) -> str:
        # `in` and `notin` are keywords wherever they stand, as in Go's lexer: never a key.
        key = self._identifier("a label key")
        if key in ("in", "notin"):
            raise self._fail(f"expected a label key but found the keyword {key!r}")
        return check_key(key, self.text)

    def _requirement(self) -> Requirement:
        if self._peek() == "!":
            self._take()
            return Requirement(self._key(), "!exists")
        key = self._key()
        token = self._peek()
        if token is None or token == ",":
            return Requirement(key, "exists")
        self._take()
        if token in ("=", "==", "!="):
            value = self._single_value()
            return Requirement(key, "!=" if token == "!=" else "=", (value,))
        if token in (">", "<"):
            bound = check_value(self._identifier("an integer"), self.text)
            if parse_int64(bound) is None:
                raise self._fail(f"{bound!r} is not an integer")
            return Requirement(key, "gt" if token == ">" else "lt", (bound,))
        if token in ("in", "notin"):
            operator: Operator = "in" if token == "in" else "notin"
            return Requirement(key, operator, self._value_set())
        raise self._fail(f"expected an operator after {key!r} but found {token!r}")

    def _single_value(self) -> str:
        token = self._peek()
        if token is None or token == ",":
            return ""  # "key=" selects the empty value
        return check_value(self._identifier("a label value"), self.text)

    def _value_set(self) -> tuple[str, ...]:
        if self._take() != "(":
            raise self._fail("expected '(' after in/notin")
        values: set[str] = set()
        expecting_value = True
        while True:
            token = self._take()
            if token is None:
                raise self._fail("missing ')'")
            if token == ")":
                if expecting_value:
                    values.add("")
                return tuple(sorted(values))
            if token == ",":
                if expecting_value:
                    values.add("")
                expecting_value = True
                continue
            if not expecting_value:
                raise self._fail(f"expected ',' or ')' but found {token!r}")
            values.add(check_value(token, self.text))
            expecting_value = False


def _tokens(text: str) -> Iterator[str]:
    at, end = 0, len(text.rstrip(" \t\r\n"))
    while at < end:
        found = _TOKEN.match(text, at)
        if found is None:
            raise SelectorError(f"unable to parse {text[at:]!r} in selector {text!r}")
        yield found.group(1)
        at = found.end()

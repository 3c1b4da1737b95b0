"""Label selectors in their string form (`app=x,tier!=db,env in (a,b),!legacy`), pure.

The podSelector fields of NodeMaintenance take this form, as kubectl's `-l` does. A
selector that does not parse matches nothing: the request then waits for or drains no pod
it did not clearly name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Operator = Literal["=", "!=", "in", "notin", "exists", "!"]

_SET = re.compile(r"^\s*([^\s!=()]+)\s+(in|notin)\s+\(([^()]*)\)\s*$")
_EQ = re.compile(r"^\s*([^\s!=()]+)\s*(==|=|!=)\s*([^\s!=(),]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*$")


class SelectorError(ValueError):
    pass


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.operator == "=":
            return present and value in self.values
        if self.operator == "!=":
            return not present or value not in self.values
        if self.operator == "in":
            return present and value in self.values
        if self.operator == "notin":
            return not present or value not in self.values
        if self.operator == "exists":
            return present
        return not present


@dataclass(frozen=True)
class Selector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


def _split(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return parts


def parse_selector(text: str) -> Selector:
    """Raise SelectorError when `text` is not a label selector; "" selects everything."""
    if not text.strip():
        return Selector()
    requirements: list[Requirement] = []
    for part in _split(text):
        if not part.strip():
            raise SelectorError(f"empty requirement in selector {text!r}")
        if match := _SET.match(part):
            values = frozenset(v.strip() for v in match.group(3).split(",") if v.strip())
            operator: Operator = "in" if match.group(2) == "in" else "notin"
            requirements.append(Requirement(match.group(1), operator, values))
        elif match := _EQ.match(part):
            operator = "!=" if match.group(2) == "!=" else "="
            requirements.append(Requirement(match.group(1), operator, frozenset({match.group(3)})))
        elif match := _EXISTS.match(part):
            operator = "!" if match.group(1) else "exists"
            requirements.append(Requirement(match.group(2), operator))
        else:
            raise SelectorError(f"cannot parse {part.strip()!r} in selector {text!r}")
    return Selector(tuple(requirements))

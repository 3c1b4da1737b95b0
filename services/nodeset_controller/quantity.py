"""Kubernetes resource quantities ("500m", "4Gi", "1e3") as exact fractions."""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(\d+(\.\d*)?|\.\d+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}

ResourceList = dict[str, Fraction]


class QuantityError(ValueError):
    pass


def parse_quantity(raw: Any) -> Fraction:
    """The value of one quantity; QuantityError when the API server would reject it."""
    if isinstance(raw, bool):
        raise QuantityError(f"{raw!r} is not a quantity")
    if isinstance(raw, int):
        return Fraction(raw)
    if isinstance(raw, float):
        return Fraction(raw)
    if not isinstance(raw, str):
        raise QuantityError(f"{raw!r} is not a quantity")
    match = _QUANTITY.match(raw.strip())
    if match is None:
        raise QuantityError(f"{raw!r} is not a quantity")
    number = Fraction(match.group("number"))
    suffix = match.group("suffix") or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    if suffix:
        return number * Fraction(10) ** int(suffix[1:])
    return number


def parse_resources(raw: Any) -> ResourceList:
    """A resource list; entries that do not parse are left out (the caller validated them)."""
    if not isinstance(raw, Mapping):
        return {}
    parsed: ResourceList = {}
    for name, value in raw.items():
        try:
            parsed[str(name)] = parse_quantity(value)
        except QuantityError:
            continue
    return parsed


def add(total: ResourceList, more: Mapping[str, Fraction]) -> None:
    for name, amount in more.items():
        total[name] = total.get(name, Fraction(0)) + amount

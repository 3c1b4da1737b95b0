"""Kubernetes resource quantities ("500m", "1Gi", "2") as exact fractions."""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction

_BINARY_SUFFIXES = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_DECIMAL_SUFFIXES = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>\d+(?:\.\d*)?|\.\d+)"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<exp>[eE][+-]?\d+)|(?P<decimal>[numkMGTPE]?))$"
)

ResourceList = dict[str, Fraction]


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: str | int | float) -> Fraction:
    """Return the exact value of a Kubernetes quantity such as "250m", "4Gi" or 8."""
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise QuantityError(f"not a quantity: {value!r}")
    number = Fraction(match["number"])
    if match["sign"] == "-":
        number = -number
    if match["binary"]:
        return number * _BINARY_SUFFIXES[match["binary"]]
    if match["exp"]:
        return number * Fraction(10) ** int(match["exp"][1:])
    return number * _DECIMAL_SUFFIXES[match["decimal"] or ""]


def parse_resources(raw: Mapping[str, object] | None) -> ResourceList:
    """Parse a Kubernetes resource list ({"cpu": "2", "memory": "1Gi"})."""
    result: ResourceList = {}
    for name, value in (raw or {}).items():
        if isinstance(value, str | int | float):
            result[name] = parse_quantity(value)
        else:
            raise QuantityError(f"resource {name}: not a quantity: {value!r}")
    return result


def add_resources(left: Mapping[str, Fraction], right: Mapping[str, Fraction]) -> ResourceList:
    """Sum two resource lists name by name."""
    total = dict(left)
    for name, value in right.items():
        total[name] = total.get(name, Fraction(0)) + value
    return total


def format_quantity(value: Fraction) -> str:
    """Render a quantity the way the API server would accept it back ("1500m", "2")."""
    if value.denominator == 1:
        return str(value.numerator)
    milli = value * 1000
    if milli.denominator == 1:
        return f"{milli.numerator}m"
    return str(float(value))

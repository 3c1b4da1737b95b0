"""Kubernetes resource quantities ("500m", "64Gi", "1e3", 8) as exact fractions.

The grammar is the one of k8s.io/apimachinery's `resource.Quantity`: an optionally signed
decimal number ("1", "1.5", "1.", ".5") followed by nothing, a binary-SI suffix (Ki .. Ei), a
decimal-SI suffix (n, u, m, k, M, G, T, P, E) or a decimal exponent ("e3", "E-2"). Values are
kept as `fractions.Fraction`, so sums and comparisons of requests never suffer float rounding.

Surrounding whitespace is accepted because the API server's JSON decoding of a quantity trims
it; a JSON number (int or float) is read from its decimal text, as the API server does.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from fractions import Fraction

ResourceList = dict[str, Fraction]

# ASCII digits only: Python's \d would also accept other scripts' digits, which Go does not.
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
BINARY_SUFFIXES: Mapping[str, int] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
DECIMAL_SUFFIXES: Mapping[str, Fraction] = {
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
_MILLI = 1000
_NANO = 10**9


class QuantityError(ValueError):
    """A value the API server would reject as a quantity."""


def parse_quantity(raw: object) -> Fraction:
    """The exact value of one quantity ("250m", "4Gi", "1e3", 8, 0.5).

    Raises QuantityError for anything the API server would not accept as a quantity,
    including booleans, non-finite floats and other types.
    """
    if isinstance(raw, bool):
        raise QuantityError(f"not a quantity: {raw!r}")
    if isinstance(raw, int):
        return Fraction(raw)
    if isinstance(raw, float):
        if not math.isfinite(raw):
            raise QuantityError(f"not a quantity: {raw!r}")
        # repr() is the shortest decimal text that reads back as this float: the JSON text.
        return Fraction(repr(raw))
    if not isinstance(raw, str):
        raise QuantityError(f"not a quantity: {raw!r}")
    return _parse_short_text(raw) if len(raw) <= _CACHED_TEXT_MAX else _parse_text(raw)


# A cluster's objects repeat a few quantity texts ("1", "64", "512Gi") thousands of times,
# and building a Fraction from text is most of what reading a resource list costs (12x a
# cached lookup). Fractions are immutable, so one parsed value serves every reader. Only short
# texts are kept (any real quantity is), so the cache stays small whatever an object holds; a
# text that does not parse raises each time (errors are not cached).
_CACHED_TEXT_MAX = 32


def _parse_text(raw: str) -> Fraction:
    match = _QUANTITY.fullmatch(raw.strip())
    if match is None:
        raise QuantityError(f"not a quantity: {raw!r}")
    number = Fraction(match["number"])
    suffix = match["suffix"] or ""
    if suffix in BINARY_SUFFIXES:
        return number * BINARY_SUFFIXES[suffix]
    if suffix in DECIMAL_SUFFIXES:
        return number * DECIMAL_SUFFIXES[suffix]
    return number * Fraction(10) ** int(suffix[1:])


_parse_short_text = functools.lru_cache(maxsize=4096)(_parse_text)


def format_quantity(value: Fraction) -> str:
    """A text the API server accepts back for `value`: "2", "1500m", "250u", "5n".

    Integers are written plainly and fractions with the coarsest of m/u/n that is exact.
    A value finer than 1n is rounded up to the next nano, as Kubernetes rounds up precision
    it cannot represent.
    """
    if value.denominator == 1:
        return str(value.numerator)
    for suffix in ("m", "u"):
        scaled = value / DECIMAL_SUFFIXES[suffix]
        if scaled.denominator == 1:
            return f"{scaled.numerator}{suffix}"
    return f"{math.ceil(value * _NANO)}n"


def round_up_to_milli(value: Fraction) -> Fraction:
    """`value` rounded up to a multiple of 1m, as the API server stores every quantity of a
    resource list (requests, limits, overhead, allocatable): "0.1m" is kept as "1m"."""
    return Fraction(math.ceil(value * _MILLI), _MILLI)


def parse_resources(raw: object, *, skip_invalid: bool = False) -> ResourceList:
    """A resource list ({"cpu": "2", "memory": "1Gi"}); None reads as empty.

    By default anything malformed raises QuantityError. With `skip_invalid`, a value that is
    not a mapping reads as empty and entries that do not parse are left out: for readers of
    objects the API server already validated, where one odd entry must not stop the reader.
    """
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        if skip_invalid:
            return {}
        raise QuantityError(f"not a resource list: {raw!r}")
    parsed: ResourceList = {}
    for name, value in raw.items():
        try:
            parsed[str(name)] = parse_quantity(value)
        except QuantityError as exc:
            if not skip_invalid:
                raise QuantityError(f"resource {name}: {exc}") from exc
    return parsed


def add_resources(left: Mapping[str, Fraction], right: Mapping[str, Fraction]) -> ResourceList:
    """The name-by-name sum of two resource lists (a new list; the inputs are not changed)."""
    total = dict(left)
    for name, amount in right.items():
        total[name] = total.get(name, Fraction(0)) + amount
    return total


def subtract_resources(left: Mapping[str, Fraction], right: Mapping[str, Fraction]) -> ResourceList:
    """The name-by-name difference `left - right` (a new list), for taking back what
    `add_resources` added; names that reach zero are dropped."""
    total = dict(left)
    for name, amount in right.items():
        remaining = total.get(name, Fraction(0)) - amount
        if remaining:
            total[name] = remaining
        else:
            total.pop(name, None)
    return total


def max_resources(left: Mapping[str, Fraction], right: Mapping[str, Fraction]) -> ResourceList:
    """The name-by-name maximum of two resource lists (a missing name counts as absent, so
    the other side's value is kept even when it is negative)."""
    result = dict(left)
    for name, amount in right.items():
        if name not in result or amount > result[name]:
            result[name] = amount
    return result

"""Slurm hostlist strings: `a-[001-003,005]` <-> `["a-001", "a-002", "a-003", "a-005"]`."""

from __future__ import annotations

import re
from collections.abc import Iterable

_NUMBERED = re.compile(r"^(.*?)(\d+)$")
_BRACKETS = re.compile(r"^(.*?)\[([^\]]+)\](.*)$")


def expand(hostlist: str) -> list[str]:
    """Expand a comma separated hostlist expression (one bracket group per name)."""
    names: list[str] = []
    for part in _split_top_level(hostlist):
        match = _BRACKETS.match(part)
        if not match:
            names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            width = len(low)
            for number in range(int(low), int(high or low) + 1):
                names.append(f"{prefix}{number:0{width}d}{suffix}")
    return names


def compress(names: Iterable[str]) -> str:
    """Compress names into a hostlist expression, in the order Slurm prints them."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    order: list[tuple[str, int] | str] = []
    for name in names:
        match = _NUMBERED.match(name)
        if not match:
            plain.append(name)
            order.append(name)
            continue
        prefix, digits = match.groups()
        key = (prefix, len(digits) if digits.startswith("0") else 0)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(digits))
    parts: list[str] = []
    for entry in order:
        if isinstance(entry, str):
            parts.append(entry)
            continue
        prefix, width = entry
        numbers = sorted(set(groups[entry]))
        if len(numbers) == 1:
            parts.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        parts.append(f"{prefix}[{_ranges(numbers, width)}]")
    return ",".join(parts)


def _ranges(numbers: list[int], width: int) -> str:
    spans: list[str] = []
    start = previous = numbers[0]
    for number in [*numbers[1:], None]:
        if number is not None and number == previous + 1:
            previous = number
            continue
        if start == previous:
            spans.append(f"{start:0{width}d}")
        else:
            spans.append(f"{start:0{width}d}-{previous:0{width}d}")
        if number is not None:
            start = previous = number
    return ",".join(spans)


def _split_top_level(hostlist: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current = ""
    for char in hostlist:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            if current:
                parts.append(current)
            current = ""
            continue
        current += char
    if current:
        parts.append(current)
    return parts

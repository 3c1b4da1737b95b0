"""Go `time.Duration` strings, as Kubernetes objects carry them (metav1.Duration fields and
annotations such as a PodGroup's waiting time or a NodeSet's update window).

One parser for every service, with Go's `time.ParseDuration` grammar: an optional sign, then
one or more decimal numbers each with a unit (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`), or a bare
`0`. Callers decide which values make sense for their field (e.g. positive only)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS: Final[Mapping[str, float]] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def go_duration_seconds(text: str) -> float:
    """Seconds of a Go duration ("30m", "1h30m", "1.5s", "-2s", "0"); ValueError for anything
    Go's time.ParseDuration would refuse."""
    value = text.strip()
    sign = -1.0 if value.startswith("-") else 1.0
    if value[:1] in ("-", "+"):
        value = value[1:]
    if value == "0":
        return 0.0
    if not value:
        raise ValueError(f"{text!r} is not a Go duration (e.g. 30m, 1h30m)")
    position, total = 0, 0.0
    while position < len(value):
        match = _PART.match(value, position)
        if match is None:
            raise ValueError(f"{text!r} is not a Go duration (e.g. 30m, 1h30m)")
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    return sign * total

"""Slurm hostlist strings: `a-[001-003,005]` <-> `["a-001", "a-002", "a-003", "a-005"]`, through
python-hostlist, held to what Slurm 24.11's `scontrol show hostnames` / `show hostlistsorted`
print (see tests/unit/clustersim/test_slurm_hostlist.py)."""

from __future__ import annotations

from collections.abc import Iterable

import hostlist  # type: ignore[import-untyped]


class InvalidHostlist(ValueError):
    """Not a hostlist Slurm accepts (unbalanced brackets, a reversed or non-numeric range)."""


def expand(expression: str) -> list[str]:
    """Every name of a hostlist expression, in order, duplicates kept, as Slurm expands it
    (several bracket groups in one name included: `node[1-2]-rack[1-2]`)."""
    try:
        names = hostlist.expand_hostlist(expression, allow_duplicates=True)
    except hostlist.BadHostlist as exc:
        raise InvalidHostlist(f"invalid hostlist {expression!r}: {exc}") from exc
    return [name.strip() for name in names if name.strip()]


def compress(names: Iterable[str]) -> str:
    """Names as a sorted hostlist expression, as Slurm prints a job's nodes.

    Slurm only ranges the number that ends a name, and groups in one dimension
    (`node1-rack[1-2],node2-rack[1-2]`, never `node[1-2]-rack[1-2]`).  python-hostlist's
    ``collect_hostlist`` repeats its pass until every dimension is grouped, so this makes one
    pass (``collect_hostlist_1``), with names that do not end in a digit set aside as its
    already-collected right-hand parts.
    """
    entries: list[tuple[str, str]] = []
    for name in names:
        if any(char in name for char in "[],"):
            raise InvalidHostlist(f"invalid host name {name!r}")
        entries.append((name, "") if name[-1:].isdigit() else ("", name))
    collected, _ = hostlist.collect_hostlist_1(entries)
    return ",".join(left + right for left, right in collected)

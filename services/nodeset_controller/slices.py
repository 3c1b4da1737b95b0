"""NodeSlices: a NodeSet's nodes spread over objects of at most 64 nodes each.

A node joins a slice when the NodeSet's pod is on it and leaves when the pod is gone. Nodes
stay in the slice they are in (a change rewrites one small object), new nodes fill the
lowest-numbered slice with room, and slices are named `<nodeset>-<index>`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MAX_NODES_PER_SLICE = 64


def slice_name(nodeset: str, index: int) -> str:
    return f"{nodeset}-{index}"


def slice_index(nodeset: str, name: str) -> int | None:
    prefix = f"{nodeset}-"
    if not name.startswith(prefix):
        return None
    tail = name[len(prefix) :]
    return int(tail) if tail.isdigit() and str(int(tail)) == tail else None


@dataclass(frozen=True)
class SliceChange:
    name: str
    nodes: tuple[str, ...]
    create: bool


def plan_slices(
    nodeset: str,
    current: Mapping[str, Iterable[str]],
    members: Iterable[str],
    capacity: int = MAX_NODES_PER_SLICE,
) -> list[SliceChange]:
    """The slices to create or rewrite so that exactly `members` are listed, once each.

    `current` maps existing slice name -> its nodes (slices of other names are ignored)."""
    wanted = set(members)
    layout: dict[int, list[str]] = {}
    placed: set[str] = set()
    for name in sorted(current, key=lambda n: slice_index(nodeset, n) or 0):
        index = slice_index(nodeset, name)
        if index is None:
            continue
        kept: list[str] = []
        for node in current[name]:
            if node in wanted and node not in placed and len(kept) < capacity:
                kept.append(node)
                placed.add(node)
        layout[index] = kept
    index = 0
    for node in sorted(wanted - placed):
        while len(layout.setdefault(index, [])) >= capacity:
            index += 1
        layout[index].append(node)
    changes: list[SliceChange] = []
    existing = {slice_index(nodeset, n): n for n in current}
    for index in sorted(layout):
        nodes = tuple(sorted(layout[index]))
        name = slice_name(nodeset, index)
        if index not in existing:
            if nodes:
                changes.append(SliceChange(name, nodes, create=True))
        elif tuple(sorted(current[name])) != nodes:
            changes.append(SliceChange(name, nodes, create=False))
    return changes

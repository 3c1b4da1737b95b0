"""Rule 2, pod naming: `<prefix>-<o3>-<o4>` from the last two octets of the node's IPv4
InternalIP, zero-padded to three digits (10.174.12.2 -> `012-002`)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass


def pod_name(prefix: str, address: ipaddress.IPv4Address) -> str:
    octets = address.packed
    return f"{prefix}-{octets[2]:03d}-{octets[3]:03d}"


@dataclass(frozen=True)
class Collision:
    """`node` would get `name`, which `holder` already has; `node` is not used."""

    node: str
    name: str
    holder: str

    def describe(self) -> str:
        return f"node {self.node} would get pod name {self.name}, already used for {self.holder}"


@dataclass(frozen=True)
class Naming:
    names: dict[str, str]  # node -> pod name, injective
    collisions: tuple[Collision, ...]


def assign_names(
    prefix: str,
    addresses: Mapping[str, ipaddress.IPv4Address],
    existing: Mapping[str, str],
) -> Naming:
    """Names for every node with an address; a name goes to one node only.

    `existing` maps node -> name of a pod of this NodeSet already there: that node keeps
    its name (a running pod is never renamed away). Other nodes compete in name order, so the
    outcome does not depend on the order the nodes were seen in.
    """
    owner: dict[str, str] = {}
    names: dict[str, str] = {}
    collisions: list[Collision] = []
    for node in sorted(existing):
        if node in addresses and existing[node] not in owner:
            name = existing[node]
            owner[name] = node
            names[node] = name
    for node in sorted(addresses):
        if node in names:
            continue
        name = pod_name(prefix, addresses[node])
        holder = owner.get(name)
        if holder is not None:
            collisions.append(Collision(node, name, holder))
            continue
        owner[name] = node
        names[node] = name
    return Naming(names, tuple(collisions))

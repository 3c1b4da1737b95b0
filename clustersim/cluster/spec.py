"""Cluster specification: node names, IPv4 addresses, resources, taints and topology labels.

A spec comes from CLI flags or a YAML file (`load_spec_file`), for example::

    nodes: 16                      # default: product of the topology shape
    name_prefix: gpu               # node names gpu-000, gpu-001, ... (or `names: [...]`)
    topology: spines=2,blocks_per_spine=2,nodes_per_block=4   # or a mapping
    capacity: {cpu: "64", memory: 512Gi, nvidia.com/gpu: 8, pods: 110}
    allocatable: {cpu: "62"}       # overrides on top of capacity
    taints: [{key: dedicated, value: gpu, effect: NoSchedule}]
    labels: {pool: a}
    instance_type: sim.h100x8
    ip_prefix: "10.174"            # first two octets
    third_octet_start: 12
    overrides: {gpu-003: {unschedulable: true, labels: {...}, taints: [...]}}

Everything here is pure: `build_node_specs` turns a `ClusterSpec` into `NodeSpec`s and
`node_object` renders one as a Kubernetes Node.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from nodeflow_kube.quantity import format_quantity, parse_quantity

TOPOLOGY_LABEL_PREFIX = "network.topology.nvidia.com/"
ACCELERATOR_LABEL = TOPOLOGY_LABEL_PREFIX + "accelerator"
BLOCK_LABEL = TOPOLOGY_LABEL_PREFIX + "block"
SPINE_LABEL = TOPOLOGY_LABEL_PREFIX + "spine"
DATACENTER_LABEL = TOPOLOGY_LABEL_PREFIX + "datacenter"
GPU_RESOURCE = "nvidia.com/gpu"
HOSTS_PER_THIRD_OCTET = 252  # fourth octets 2..253: skip network, gateway (.1), and the top
KUBELET_VERSION = "v1.31.4"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

DEFAULT_CAPACITY: dict[str, str] = {
    "cpu": "64",
    "memory": "512Gi",
    GPU_RESOURCE: "8",
    "pods": "110",
    "ephemeral-storage": "1Ti",
}


class SpecError(ValueError):
    """An invalid cluster specification."""


@dataclass(frozen=True)
class TopologyShape:
    """How nodes nest: nodes -> accelerator domains -> blocks -> spines -> datacenters."""

    datacenters: int = 1
    spines: int = 1
    blocks_per_spine: int = 1
    nodes_per_block: int = 8
    nodes_per_accelerator: int | None = None  # default: one accelerator domain per block

    @property
    def node_count(self) -> int:
        return self.datacenters * self.spines * self.blocks_per_spine * self.nodes_per_block

    @property
    def accelerator_size(self) -> int:
        return self.nodes_per_accelerator or self.nodes_per_block


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""

    def to_api(self) -> dict[str, str]:
        body = {"key": self.key, "effect": self.effect}
        if self.value:
            body["value"] = self.value
        return body


@dataclass(frozen=True)
class NodeOverride:
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] | None = None
    capacity: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool | None = None


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int | None = None
    names: tuple[str, ...] = ()
    name_prefix: str = "node"
    topology: TopologyShape | None = None
    capacity: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_CAPACITY))
    allocatable: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    instance_type: str = "sim.h100x8"
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    ip_prefix: str = "10.174"
    third_octet_start: int = 12
    overrides: Mapping[str, NodeOverride] = field(default_factory=dict)


@dataclass(frozen=True)
class TopologyPlace:
    datacenter: str
    spine: str
    block: str
    accelerator: str


@dataclass(frozen=True)
class NodeSpec:
    name: str
    internal_ip: str
    capacity: Mapping[str, str]
    allocatable: Mapping[str, str]
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    unschedulable: bool = False


def parse_topology(text: str) -> TopologyShape:
    """Parse "spines=2,blocks_per_spine=4,nodes_per_block=8" into a shape."""
    values: dict[str, int] = {}
    allowed = {f.name for f in dataclasses.fields(TopologyShape)}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = part.partition("=")
        key = key.strip()
        if not sep or key not in allowed:
            raise SpecError(f"topology: expected one of {sorted(allowed)} as key=value: {part!r}")
        values[key] = _positive_int(raw.strip(), f"topology {key}")
    return TopologyShape(**values)


def _positive_int(raw: object, what: str) -> int:
    try:
        number = int(str(raw))
    except ValueError as exc:
        raise SpecError(f"{what}: not an integer: {raw!r}") from exc
    if number < 1:
        raise SpecError(f"{what}: must be at least 1, got {number}")
    return number


def parse_taint(text: str) -> Taint:
    """Parse "key=value:Effect" or "key:Effect" (kubectl taint syntax)."""
    head, sep, effect = text.rpartition(":")
    if not sep or effect not in TAINT_EFFECTS:
        raise SpecError(f"taint {text!r}: expected key[=value]:{'|'.join(TAINT_EFFECTS)}")
    key, _, value = head.partition("=")
    if not key:
        raise SpecError(f"taint {text!r}: empty key")
    return Taint(key=key, value=value, effect=effect)


def _taint_from_mapping(raw: object) -> Taint:
    if isinstance(raw, str):
        return parse_taint(raw)
    if not isinstance(raw, Mapping) or "key" not in raw or "effect" not in raw:
        raise SpecError(f"taint {raw!r}: needs key and effect")
    if raw["effect"] not in TAINT_EFFECTS:
        raise SpecError(f"taint {raw!r}: effect must be one of {TAINT_EFFECTS}")
    return Taint(key=str(raw["key"]), value=str(raw.get("value") or ""), effect=raw["effect"])


def _string_map(raw: object, what: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SpecError(f"{what}: expected a mapping, got {raw!r}")
    return {str(k): str(v) for k, v in raw.items()}


def _resource_map(raw: object, what: str) -> dict[str, str]:
    resources = _string_map(raw, what)
    for name, value in resources.items():
        try:
            parse_quantity(value)
        except ValueError as exc:
            raise SpecError(f"{what} {name}: {exc}") from exc
    return resources


_SPEC_KEYS = {f.name for f in dataclasses.fields(ClusterSpec)}
_OVERRIDE_KEYS = {f.name for f in dataclasses.fields(NodeOverride)}


def spec_from_mapping(raw: Mapping[str, Any]) -> ClusterSpec:
    """Build a ClusterSpec from a decoded YAML document; unknown keys are errors."""
    unknown = set(raw) - _SPEC_KEYS
    if unknown:
        raise SpecError(f"unknown cluster spec keys: {sorted(unknown)}")
    base = ClusterSpec()
    kwargs: dict[str, Any] = {}
    if raw.get("nodes") is not None:
        kwargs["nodes"] = _positive_int(raw["nodes"], "nodes")
    if "names" in raw:
        kwargs["names"] = tuple(str(n) for n in raw["names"] or ())
    topology = raw.get("topology")
    if isinstance(topology, str):
        kwargs["topology"] = parse_topology(topology)
    elif isinstance(topology, Mapping):
        kwargs["topology"] = parse_topology(",".join(f"{k}={v}" for k, v in topology.items()))
    elif topology is not None:
        raise SpecError(f"topology: expected a string or mapping, got {topology!r}")
    if "capacity" in raw:
        kwargs["capacity"] = {**base.capacity, **_resource_map(raw["capacity"], "capacity")}
    if "allocatable" in raw:
        kwargs["allocatable"] = _resource_map(raw["allocatable"], "allocatable")
    if "taints" in raw:
        kwargs["taints"] = tuple(_taint_from_mapping(t) for t in raw["taints"] or ())
    if "labels" in raw:
        kwargs["labels"] = _string_map(raw["labels"], "labels")
    for key in ("name_prefix", "instance_type", "gpu_product", "ip_prefix"):
        if key in raw:
            kwargs[key] = str(raw[key])
    if "third_octet_start" in raw:
        kwargs["third_octet_start"] = int(raw["third_octet_start"])
    if "overrides" in raw:
        kwargs["overrides"] = {
            str(name): _override_from_mapping(str(name), body)
            for name, body in (raw["overrides"] or {}).items()
        }
    return dataclasses.replace(base, **kwargs)


def _override_from_mapping(name: str, raw: object) -> NodeOverride:
    if not isinstance(raw, Mapping):
        raise SpecError(f"overrides.{name}: expected a mapping")
    unknown = set(raw) - _OVERRIDE_KEYS
    if unknown:
        raise SpecError(f"overrides.{name}: unknown keys {sorted(unknown)}")
    taints = raw.get("taints")
    unschedulable = raw.get("unschedulable")
    return NodeOverride(
        labels=_string_map(raw.get("labels"), f"overrides.{name}.labels"),
        taints=None if taints is None else tuple(_taint_from_mapping(t) for t in taints),
        capacity=_resource_map(raw.get("capacity"), f"overrides.{name}.capacity"),
        allocatable=_resource_map(raw.get("allocatable"), f"overrides.{name}.allocatable"),
        unschedulable=None if unschedulable is None else bool(unschedulable),
    )


def load_spec_file(path: str) -> ClusterSpec:
    with open(path, encoding="utf-8") as handle:
        raw = yaml.safe_load(handle) or {}
    if not isinstance(raw, Mapping):
        raise SpecError(f"{path}: expected a mapping at the top level")
    return spec_from_mapping(raw)


def resolved_node_count(spec: ClusterSpec) -> int:
    """Explicit count, else the number of explicit names, else the topology's product."""
    if spec.nodes is not None:
        return spec.nodes
    if spec.names:
        return len(spec.names)
    if spec.topology is not None:
        return spec.topology.node_count
    return 1


def node_names(spec: ClusterSpec, count: int) -> list[str]:
    if spec.names:
        if len(spec.names) < count:
            raise SpecError(f"{count} nodes but only {len(spec.names)} names given")
        names = list(spec.names[:count])
    else:
        width = max(3, len(str(count - 1)))
        names = [f"{spec.name_prefix}-{index:0{width}d}" for index in range(count)]
    if len(set(names)) != len(names):
        raise SpecError("node names must be unique")
    return names


def default_topology(nodes: int, third_octet_start: int = 12) -> TopologyShape:
    """The shape `make run NODES=n` uses when no TOPOLOGY is given: the small default (two
    spines of two blocks of four) up to 16 nodes, then blocks that grow with the cluster (4, 8,
    32 nodes, as GPU clusters' leaf blocks do, and larger where the /16 would run out of third
    octets) under as many spines as keep each spine at 16 blocks or fewer."""
    if nodes <= 16:
        return TopologyShape(spines=2, blocks_per_spine=2, nodes_per_block=4)
    free_thirds = 256 - third_octet_start  # third octets from the first one up
    per_block = next(
        (size for size in (4, 8, 32, 64, 126) if nodes <= size * min(free_thirds, 16 * size)),
        HOSTS_PER_THIRD_OCTET,
    )
    blocks = math.ceil(nodes / per_block)
    spines = max(2, math.ceil(blocks / 16))
    return TopologyShape(
        spines=spines, blocks_per_spine=math.ceil(blocks / spines), nodes_per_block=per_block
    )


def check_addresses(
    count: int, nodes_per_block: int, ip_prefix: str = "10.174", third_octet_start: int = 12
) -> None:
    """Refuse, in one line that says which values would work, a node count and block size
    whose addresses do not fit the /16 (each block starts on its own third octet)."""
    available = 256 - third_octet_start
    thirds_per_block = math.ceil(nodes_per_block / HOSTS_PER_THIRD_OCTET)
    needed = math.ceil(count / nodes_per_block) * thirds_per_block
    if needed <= available:
        return
    most_nodes = (available // thirds_per_block) * nodes_per_block
    smallest_block = math.ceil(count / available)
    block_hint = (
        f"nodes_per_block >= {smallest_block}"
        if smallest_block <= HOSTS_PER_THIRD_OCTET
        else "no block size fits"
    )
    raise SpecError(
        f"{count} nodes in blocks of {nodes_per_block} need {needed} third octets of "
        f"{ip_prefix}.0.0/16 but {available} are free from .{third_octet_start}: use "
        f"{block_hint} (or no topology, which grows with the node count), or at most "
        f"{most_nodes} nodes"
    )


def internal_ips(
    count: int, nodes_per_block: int, ip_prefix: str = "10.174", third_octet_start: int = 12
) -> list[str]:
    """Spread addresses so each block gets its own third octet(s) and nodes are .2, .3, ...

    Every node gets a distinct (third, fourth) octet pair, which NodeSet pod names are made
    from (10.174.12.2 -> 012-002).
    """
    octets = ip_prefix.split(".")
    if len(octets) != 2 or not all(o.isdigit() and 0 <= int(o) <= 255 for o in octets):
        raise SpecError(f"ip_prefix must be two octets like 10.174, got {ip_prefix!r}")
    check_addresses(count, nodes_per_block, ip_prefix, third_octet_start)
    thirds_per_block = math.ceil(nodes_per_block / HOSTS_PER_THIRD_OCTET)
    addresses = []
    for index in range(count):
        block, position = divmod(index, nodes_per_block)
        third = third_octet_start + block * thirds_per_block + position // HOSTS_PER_THIRD_OCTET
        fourth = 2 + position % HOSTS_PER_THIRD_OCTET
        addresses.append(f"{ip_prefix}.{third}.{fourth}")
    return addresses


def check_spec(spec: ClusterSpec) -> None:
    """Everything that would stop the simulator later, found before it starts."""
    count = resolved_node_count(spec)
    shape = spec.topology or _shape_without_topology(spec, count)
    internal_ips(count, shape.nodes_per_block, spec.ip_prefix, spec.third_octet_start)


def topology_place(index: int, shape: TopologyShape) -> TopologyPlace:
    """Where node `index` sits; domain names are unique across the whole cluster."""
    block = index // shape.nodes_per_block
    accelerator = (
        block * math.ceil(shape.nodes_per_block / shape.accelerator_size)
        + (index % shape.nodes_per_block) // shape.accelerator_size
    )
    spine = block // shape.blocks_per_spine
    datacenter = spine // shape.spines
    return TopologyPlace(
        datacenter=f"dc-{datacenter}",
        spine=f"spine-{spine}",
        block=f"block-{block}",
        accelerator=f"nvl-{accelerator}",
    )


def topology_labels(place: TopologyPlace) -> dict[str, str]:
    return {
        ACCELERATOR_LABEL: place.accelerator,
        BLOCK_LABEL: place.block,
        SPINE_LABEL: place.spine,
        DATACENTER_LABEL: place.datacenter,
    }


def _shape_without_topology(spec: ClusterSpec, count: int) -> TopologyShape:
    """A spec that names no topology: blocks of up to eight nodes while its address range
    holds them, else the shape that grows with the node count (`default_topology`), as a
    spec file of 4,000 nodes is no less valid than `make run NODES=4000`."""
    small = TopologyShape(nodes_per_block=min(count, 8))
    try:
        check_addresses(count, small.nodes_per_block, spec.ip_prefix, spec.third_octet_start)
    except SpecError:
        return default_topology(count, spec.third_octet_start)
    return small


def build_node_specs(spec: ClusterSpec) -> list[NodeSpec]:
    count = resolved_node_count(spec)
    shape = spec.topology or _shape_without_topology(spec, count)
    names = node_names(spec, count)
    unknown_overrides = set(spec.overrides) - set(names)
    if unknown_overrides:
        raise SpecError(f"overrides for unknown nodes: {sorted(unknown_overrides)}")
    ips = internal_ips(count, shape.nodes_per_block, spec.ip_prefix, spec.third_octet_start)
    result = []
    for index, (name, ip) in enumerate(zip(names, ips, strict=True)):
        override = spec.overrides.get(name, NodeOverride())
        capacity = {**spec.capacity, **override.capacity}
        allocatable = {**capacity, **spec.allocatable, **override.allocatable}
        gpus = parse_quantity(capacity.get(GPU_RESOURCE, "0"))
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": spec.instance_type,
            "beta.kubernetes.io/instance-type": spec.instance_type,
            "nvidia.com/gpu.present": "true" if gpus > 0 else "false",
            **topology_labels(topology_place(index, shape)),
        }
        if gpus > 0:
            labels["nvidia.com/gpu.count"] = format_quantity(gpus)
            labels["nvidia.com/gpu.product"] = spec.gpu_product
        labels.update(spec.labels)
        labels.update(override.labels)
        result.append(
            NodeSpec(
                name=name,
                internal_ip=ip,
                capacity=capacity,
                allocatable=allocatable,
                labels=labels,
                taints=spec.taints if override.taints is None else override.taints,
                unschedulable=bool(override.unschedulable),
            )
        )
    return result


def node_conditions(ready: bool, now: str, reason: str = "") -> list[dict[str, str]]:
    """Kubelet-style node conditions; Ready status follows `ready`."""
    pressures = [
        ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
        ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ]
    conditions = [
        {
            "type": kind,
            "status": "False",
            "reason": why,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        for kind, why, message in pressures
    ]
    if ready:
        ready_condition = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
        }
    else:
        ready_condition = {
            "type": "Ready",
            "status": "Unknown" if not reason else "False",
            "reason": reason or "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status."
            if not reason
            else f"simulated: {reason}",
        }
    ready_condition["lastHeartbeatTime"] = now
    ready_condition["lastTransitionTime"] = now
    conditions.append(ready_condition)
    return conditions


def _stable_id(name: str, salt: str) -> str:
    return hashlib.sha256(f"{salt}:{name}".encode()).hexdigest()[:32]


def node_object(node: NodeSpec, now: str) -> dict[str, Any]:
    """Render a NodeSpec as the Kubernetes Node a freshly registered kubelet would post."""
    spec: dict[str, Any] = {"podCIDR": "", "providerID": f"sim://{node.name}"}
    if node.taints:
        spec["taints"] = [t.to_api() for t in node.taints]
    if node.unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": dict(node.labels),
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": spec,
        "status": {
            "capacity": dict(node.capacity),
            "allocatable": dict(node.allocatable),
            "addresses": [
                {"type": "InternalIP", "address": node.internal_ip},
                {"type": "Hostname", "address": node.name},
            ],
            "conditions": node_conditions(True, now),
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": str(uuid.UUID(_stable_id(node.name, "boot"))),
                "containerRuntimeVersion": "containerd://1.7.24",
                "kernelVersion": "6.8.0-sim",
                "kubeProxyVersion": KUBELET_VERSION,
                "kubeletVersion": KUBELET_VERSION,
                "machineID": _stable_id(node.name, "machine"),
                "operatingSystem": "linux",
                "osImage": "Ubuntu 22.04.5 LTS",
                "systemUUID": str(uuid.UUID(_stable_id(node.name, "system"))),
            },
            "phase": "Running",
        },
    }


def merge_cli_overrides(
    spec: ClusterSpec,
    nodes: int | None = None,
    topology: str | None = None,
    taints: Sequence[str] = (),
    name_prefix: str | None = None,
) -> ClusterSpec:
    """CLI flags win over the spec file."""
    changes: dict[str, Any] = {}
    if nodes is not None:
        changes["nodes"] = _positive_int(nodes, "--nodes")
    if topology:
        changes["topology"] = parse_topology(topology)
    if taints:
        changes["taints"] = spec.taints + tuple(parse_taint(t) for t in taints)
    if name_prefix:
        changes["name_prefix"] = name_prefix
    return dataclasses.replace(spec, **changes)

"""What a pod asks of a node and whether the node has it (kube-scheduler's NodeResourcesFit).

`pod_requests` follows k8s.io/component-helpers' PodRequests: containers are summed; init
containers run one at a time, each alongside the sidecars (init containers with
restartPolicy Always) started before it, so the pod needs at least the largest of those
moments; sidecars also run next to the app containers; pod-level requests (PodLevelResources)
replace the container sum for cpu, memory and hugepages; the RuntimeClass overhead is added.
Every pod also takes one of the node's `pods` slots (the scheduler's "Too many pods").
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from nodeflow_kube.fields import Obj, mapping, sequence
from nodeflow_kube.quantity import (
    ResourceList,
    add_resources,
    max_resources,
    parse_resources,
    round_up_to_milli,
)

PODS = "pods"
SIDECAR_RESTART_POLICY = "Always"
# Resources pod-level requests may set; everything else comes from the containers.
_POD_LEVEL_RESOURCES = frozenset({"cpu", "memory"})
_HUGEPAGES_PREFIX = "hugepages-"
# Pod-level requests default to the containers' sum only for resources that may be
# overcommitted (not hugepages).
_OVERCOMMITTABLE = frozenset({"cpu", "memory"})


def stored_resources(raw: object) -> ResourceList:
    """A resource list as the API server stores it: quantities rounded up to 1m; entries that
    do not parse are left out (the API server would have rejected them)."""
    return {
        name: round_up_to_milli(amount)
        for name, amount in parse_resources(raw, skip_invalid=True).items()
    }


def container_requests(container: Obj) -> ResourceList:
    """A container's requests, where a resource with a limit but no request requests its limit
    (the API server's defaulting of a Pod; a template gets it when its pod is created)."""
    resources = mapping(container.get("resources"))
    requests = stored_resources(resources.get("limits"))
    requests.update(stored_resources(resources.get("requests")))
    return requests


def is_sidecar(container: Obj) -> bool:
    """An init container that keeps running next to the app containers."""
    return container.get("restartPolicy") == SIDECAR_RESTART_POLICY


def container_sum_requests(pod_spec: Obj) -> ResourceList:
    """The containers' part of a pod's requests (AggregateContainerRequests).

    total = max(sum(containers) + sum(sidecars),
                max over regular init containers i of (init_i + sum(sidecars before i)),
                max over sidecars s of sum(sidecars up to and including s))
    """
    total: ResourceList = {}
    for container in sequence(pod_spec.get("containers")):
        total = add_resources(total, container_requests(mapping(container)))
    sidecars: ResourceList = {}
    init_peak: ResourceList = {}
    for raw in sequence(pod_spec.get("initContainers")):
        init = mapping(raw)
        requests = container_requests(init)
        if is_sidecar(init):
            total = add_resources(total, requests)
            sidecars = add_resources(sidecars, requests)
            moment = sidecars
        else:
            moment = add_resources(requests, sidecars)
        init_peak = max_resources(init_peak, moment)
    return max_resources(total, init_peak)


def _is_pod_level_resource(name: str) -> bool:
    return name in _POD_LEVEL_RESOURCES or name.startswith(_HUGEPAGES_PREFIX)


def pod_level_requests(pod_spec: Obj, containers: Mapping[str, Fraction]) -> ResourceList:
    """The pod-level requests (`spec.resources.requests`) as the API server defaults them.

    When pod-level limits are set, a supported resource without a pod-level request takes the
    containers' sum (cpu, memory) or else the pod-level limit.
    """
    resources = mapping(pod_spec.get("resources"))
    requests = {
        name: amount
        for name, amount in stored_resources(resources.get("requests")).items()
        if _is_pod_level_resource(name)
    }
    limits = stored_resources(resources.get("limits"))
    if not limits:
        return requests
    for name, amount in containers.items():
        if name in _OVERCOMMITTABLE and name not in requests:
            requests[name] = amount
    for name, amount in limits.items():
        if _is_pod_level_resource(name) and name not in requests:
            requests[name] = amount
    return requests


def pod_requests(pod_spec: Obj) -> ResourceList:
    """What the scheduler charges a node for a pod with this spec (see the module docstring),
    including `pods: 1`."""
    total = container_sum_requests(pod_spec)
    total.update(pod_level_requests(pod_spec, total))
    total = add_resources(total, stored_resources(pod_spec.get("overhead")))
    total[PODS] = total.get(PODS, Fraction(0)) + 1
    return total


def node_allocatable(node: Obj) -> ResourceList:
    """What a node offers to pods: `status.allocatable`, or `status.capacity` when allocatable
    is unset (the API server defaults allocatable to capacity)."""
    status = mapping(node.get("status"))
    allocatable = status.get("allocatable")
    return stored_resources(allocatable if allocatable is not None else status.get("capacity"))


def insufficient_resources(
    requests: Mapping[str, Fraction],
    allocatable: Mapping[str, Fraction],
    used: Mapping[str, Fraction],
) -> list[str]:
    """Names (sorted) of the resources whose request exceeds allocatable minus `used` (what
    other pods on the node request). A zero request never fails, a resource the node does not
    offer counts as 0 allocatable."""
    short: list[str] = []
    for name in sorted(requests):
        amount = requests[name]
        if amount <= 0:
            continue
        free = allocatable.get(name, Fraction(0)) - used.get(name, Fraction(0))
        if amount > free:
            short.append(name)
    return short

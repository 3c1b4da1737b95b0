"""Which pods a drain evicts, which it leaves, and what holds it (pure).

The order of the checks fixes the reference operator's defect: `podEvictionFilters` decide
which pods are evicted *before* the emptyDir and unmanaged-pod checks, so a pod the filters
leave alone never blocks the drain (upstream runs kubectl's chain, which fails the whole drain
on such a pod first). The chain for each pod on the node that matches `drainSpec.podSelector`:

  1. DaemonSet pods and mirror pods: skipped (never evicted; they would come straight back).
  2. podEvictionFilters, when any: a pod none matches is skipped. A filter matches when its
     regex matches anywhere in the name of a resource any regular container requests.
  3. emptyDir volume: evicted only with `deleteEmptyDir` (the data is lost), else it blocks.
  4. no controller: evicted only with `force` (nothing re-creates it), else it blocks.
  Finished pods (Succeeded/Failed) pass 3 and 4: nothing is lost by removing them.

Like `kubectl drain`, a drain with a blocking pod evicts nothing until the spec or the pod
changes. A NodeSet pod (a Slurm node) is evicted only once Slurm reports its node drained
and idle (or down), read from a known, fresh state: an eviction never kills a running job.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import re2  # type: ignore[import-untyped]

from maintenance_scheduler.api import DrainSpec
from maintenance_scheduler.pods import PodFacts
from nodeflow_kube.labels import SelectorError, parse_label_selector

# The reference operator never drains its own pods; neither do we drain ours.
SELF_LABELS: tuple[tuple[str, str], ...] = (
    ("app.kubernetes.io/component", "maintenance-operator-controller-manager"),
    ("app.kubernetes.io/name", "maintenance-scheduler"),
)


@dataclass(frozen=True)
class Held:
    pod: PodFacts
    why: str


@dataclass
class DrainPlan:
    # Pods the drain must see gone (present now; terminating ones included).
    to_go: list[PodFacts] = field(default_factory=list)
    # Of those, the ones to evict now.
    evict_now: list[PodFacts] = field(default_factory=list)
    # NodeSet pods whose Slurm node still runs (or may run) a job.
    waiting_for_slurm: list[Held] = field(default_factory=list)
    # Pods that stop the drain (emptyDir without deleteEmptyDir, no controller without force).
    blocking: list[Held] = field(default_factory=list)
    # Pods left on the node on purpose (DaemonSet, mirror, filtered out).
    skipped: list[Held] = field(default_factory=list)
    # Every pod on the node (status.drain.totalPods).
    total_pods: int = 0
    selector_error: str = ""

    @property
    def done(self) -> bool:
        return not self.to_go and not self.blocking and not self.selector_error


class _Pattern(Protocol):
    def search(self, text: str) -> object: ...


@functools.lru_cache(maxsize=256)
def _go_regexp(pattern: str) -> _Pattern | None:
    r"""The pattern compiled with RE2, the syntax of Go's regexp (POSIX classes `[[:alpha:]]`,
    `\pL`, `\z`; no backreferences or lookaround), None when it does not compile. RE2 also
    runs in time linear in the input, so no pattern a request carries can stall a round."""
    try:
        compiled: _Pattern = re2.compile(pattern)
    except re2.error:
        return None
    return compiled


def filter_matches(pattern: str, resource_names: Iterable[str]) -> bool:
    """Go's regexp MatchString semantics (a match anywhere); an invalid regex matches
    nothing, as upstream."""
    compiled = _go_regexp(pattern)
    return compiled is not None and any(compiled.search(name) for name in resource_names)


def _is_self(pod: PodFacts) -> bool:
    return any(pod.labels.get(key) == value for key, value in SELF_LABELS)


def plan_drain(spec: DrainSpec, pods: Iterable[PodFacts]) -> DrainPlan:
    pods = list(pods)
    plan = DrainPlan(total_pods=len(pods))
    try:
        selector = parse_label_selector(spec.pod_selector)
    except SelectorError as exc:
        plan.selector_error = str(exc)
        return plan
    for pod in sorted(pods, key=lambda p: p.key):
        if _is_self(pod) or not selector.matches(pod.labels):
            continue
        if pod.daemonset:
            plan.skipped.append(Held(pod, "DaemonSet pod"))
            continue
        if pod.mirror:
            plan.skipped.append(Held(pod, "mirror pod"))
            continue
        if spec.eviction_filters and not any(
            filter_matches(f, pod.requested_resources) for f in spec.eviction_filters
        ):
            plan.skipped.append(Held(pod, "no podEvictionFilter matches"))
            continue
        if not pod.terminal and not pod.terminating:
            if pod.empty_dir and not spec.delete_empty_dir:
                plan.blocking.append(Held(pod, "uses emptyDir (deleteEmptyDir is false)"))
                continue
            if not pod.has_controller and not spec.force:
                plan.blocking.append(Held(pod, "has no controller (force is false)"))
                continue
        plan.to_go.append(pod)
    if plan.blocking:
        # As kubectl drain: nothing is evicted while a pod blocks the drain.
        return plan
    for pod in plan.to_go:
        if pod.terminating:
            continue
        if pod.slurm is not None and not pod.terminal and not pod.slurm.drained_and_idle:
            plan.waiting_for_slurm.append(
                Held(pod, f"Slurm node {pod.name}: {pod.slurm.describe()}, a job may run")
            )
            continue
        plan.evict_now.append(pod)
    return plan


def drain_progress(eviction_pods: int, remaining: int) -> int:
    """floor((evictionPods - remaining) / evictionPods * 100); 100 when nothing to evict."""
    if eviction_pods <= 0:
        return 100
    done = max(0, eviction_pods - remaining)
    return max(0, min(100, done * 100 // eviction_pods))

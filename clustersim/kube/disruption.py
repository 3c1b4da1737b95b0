"""Disruption: the eviction subresource and PodDisruptionBudgets.  An eviction marks the pod
DisruptionTarget and deletes it unless the one budget selecting it has no disruption left to
give; the budgets' status is what the disruption controller would compute (healthy pods, the
replicas of their controllers through the scale subresource)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from clustersim.kube import errors
from clustersim.kube.errors import Cause, TooManyRequests
from clustersim.kube.objects import DeleteResult, Obj, deep_copy, get_path, now_rfc3339
from clustersim.kube.resources import ResourceInfo
from clustersim.kube.selectors import selector_from_match

if TYPE_CHECKING:
    from clustersim.kube.objectstore import ObjectStore


class Disruption:
    """Evictions and PodDisruptionBudget status for ``store`` (which owns it)."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store

    def evict(
        self, name: str, namespace: str, delete_options: Mapping[str, Any] | None = None
    ) -> DeleteResult:
        """pods/eviction: delete the pod unless a PodDisruptionBudget forbids it (429)."""
        info = self._store._infos["pods"]
        pod = self._store._lookup(info, name, namespace)
        options = dict(delete_options or {})
        # kube-apiserver's canIgnorePDB: a finished, Pending or deleting pod is evicted
        # whatever its budgets say (a Pending pod counts as no disruption).
        phase = (pod.get("status") or {}).get("phase")
        ignores_budgets = phase in ("Succeeded", "Failed", "Pending")
        if not ignores_budgets and not pod["metadata"].get("deletionTimestamp"):
            budgets = self._matching_pdbs(pod)
            if len(budgets) > 1:
                raise errors.InternalError(
                    "This pod has more than one PodDisruptionBudget, which the eviction "
                    "subresource does not support."
                )
            if budgets:
                self._charge_budget(budgets[0], pod)
        if not options.get("dryRun") and _preconditions_hold(pod, options.get("preconditions")):
            self._mark_disruption_target(info, pod)
        return self._store.delete(
            info,
            name,
            namespace,
            grace_period_seconds=options.get("gracePeriodSeconds"),
            propagation_policy=options.get("propagationPolicy"),
            preconditions=options.get("preconditions"),
            dry_run=bool(options.get("dryRun")),
        )

    def _mark_disruption_target(self, info: ResourceInfo, pod: Obj) -> None:
        """What kube-apiserver (PodDisruptionConditions, GA in 1.31) writes to the pod's status
        before an eviction deletes it, so its Job's podFailurePolicy can tell."""
        new = deep_copy(pod)
        status = new.setdefault("status", {})
        conditions = list(status.get("conditions") or [])
        previous = next((c for c in conditions if c.get("type") == "DisruptionTarget"), None)
        now = now_rfc3339()
        condition = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting",
            "lastProbeTime": None,
            "lastTransitionTime": now,
        }
        if previous is not None and previous.get("status") == "True":
            condition["lastTransitionTime"] = previous.get("lastTransitionTime", now)
        status["conditions"] = [c for c in conditions if c is not previous] + [condition]
        if new == pod:
            return
        self._store._stamp(new)
        self._store._bucket(info, new["metadata"]["namespace"])[new["metadata"]["name"]] = new
        self._store._index(info, new, pod, removed=False)
        self._store._commit(info, "MODIFIED", new, pod)
        self._store._after_write(info, new, pod)

    def _matching_pdbs(self, pod: Obj) -> list[Obj]:
        ns = pod["metadata"]["namespace"]
        labels = pod["metadata"].get("labels") or {}
        out = []
        for pdb in self._store._objects["poddisruptionbudgets.policy"].get(ns, {}).values():
            selector = (pdb.get("spec") or {}).get("selector")
            if selector is None:
                continue
            if selector_from_match(selector).matches(labels):
                out.append(pdb)
        return out

    def _charge_budget(self, pdb: Obj, pod: Obj) -> None:
        status = pdb.get("status") or {}
        healthy = _pod_is_healthy(pod)
        allowed = int(status.get("disruptionsAllowed", 0))
        if (healthy and allowed <= 0) or (
            not healthy and (status.get("currentHealthy", 0) < status.get("desiredHealthy", 0))
        ):
            raise TooManyRequests(
                "Cannot evict pod as it would violate the pod's disruption budget.",
                causes=[
                    Cause(
                        "DisruptionBudget",
                        f"The disruption budget {pdb['metadata']['name']} needs "
                        f"{status.get('desiredHealthy', 0)} healthy pods and has "
                        f"{status.get('currentHealthy', 0)} currently",
                    )
                ],
            )
        if not healthy:
            return
        new = deep_copy(pdb)
        new_status = new.setdefault("status", {})
        new_status["disruptionsAllowed"] = allowed - 1
        new_status.setdefault("disruptedPods", {})[pod["metadata"]["name"]] = now_rfc3339()
        self._store._write_status(self._store._infos["poddisruptionbudgets.policy"], new, pdb)

    def refresh_pdbs(self, namespace: str) -> None:
        info = self._store._infos["poddisruptionbudgets.policy"]
        budgets = self._store._objects[info.key].get(namespace)
        if not budgets:
            return
        pods = list(self._store._objects["pods"].get(namespace, {}).values())
        for pdb in list(budgets.values()):
            new_status = compute_pdb_status(pdb, pods, self._controller_scale)
            if new_status is not None and new_status != pdb.get("status"):
                new = deep_copy(pdb)
                new["status"] = new_status
                self._store._write_status(info, new, pdb)

    def _controller_scale(self, ref: Mapping[str, Any], namespace: str) -> int | None:
        """The disruption controller's finder for a pod's controller: the desired replicas of
        the owner's scale subresource, or None when the owner has no scale or is not there."""
        group = str(ref.get("apiVersion", "")).rpartition("/")[0]
        for info in self._store._infos.values():
            if info.group != group or info.kind != ref.get("kind") or info.scale is None:
                continue
            owner = self._store._objects[info.key].get(namespace if info.namespaced else "", {})
            obj = owner.get(str(ref.get("name")))
            if obj is None or obj["metadata"].get("uid") != ref.get("uid"):
                return None
            return int(get_path(obj, info.scale.spec_replicas_path) or 0)
        return None


def _pod_is_healthy(pod: Mapping[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _resolve_int_or_percent(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        pct = int(value[:-1])
        raw = pct * total / 100
        return math.ceil(raw) if round_up else math.floor(raw)
    return int(value)


ControllerScale = Callable[[Mapping[str, Any], str], int | None]


def _no_controllers(ref: Mapping[str, Any], namespace: str) -> int | None:
    return None


def _expected_scale(
    pods: Iterable[Mapping[str, Any]], controller_scale: ControllerScale
) -> int | None:
    """The sum of the desired replicas of the pods' controllers, each counted once. Pods
    without a controller do not count (the real controller warns UnmanagedPods); a controller
    it cannot scale makes the status incomputable (None: the status stays as it was)."""
    scales: dict[str, int] = {}
    for pod in pods:
        meta = pod["metadata"]
        ref = next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), None)
        if ref is None or ref.get("uid") in scales:
            continue
        scale = controller_scale(ref, str(meta.get("namespace", "")))
        if scale is None:
            return None
        scales[str(ref.get("uid"))] = scale
    return sum(scales.values())


def compute_pdb_status(
    pdb: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    controller_scale: ControllerScale = _no_controllers,
) -> Obj | None:
    """The status the disruption controller maintains for a PodDisruptionBudget, or None where
    it cannot compute one. An integer minAvailable counts the selected pods; maxUnavailable and a
    percentage minAvailable count the replicas of the pods' controllers (scale subresource), so
    pods without a controller give an expected count of 0 and no disruption allowed."""
    spec = pdb.get("spec") or {}
    # policy/v1: an empty selector selects every pod of the namespace, a null one none.
    raw_selector = spec.get("selector")
    selector = selector_from_match(raw_selector) if raw_selector is not None else None
    matching = [
        p for p in pods if selector is not None and selector.matches(p["metadata"].get("labels"))
    ]
    healthy = sum(1 for p in matching if _pod_is_healthy(p))
    min_available = spec.get("minAvailable")
    if min_available is not None and not isinstance(min_available, str):
        expected = len(matching)
        desired = int(min_available)
    elif min_available is not None or "maxUnavailable" in spec:
        scaled = _expected_scale(matching, controller_scale)
        if scaled is None:
            return None
        expected = scaled
        if min_available is not None:
            desired = _resolve_int_or_percent(min_available, expected, round_up=True)
        else:
            unavailable = _resolve_int_or_percent(spec["maxUnavailable"], expected, True)
            desired = max(0, expected - unavailable)
    else:
        expected = len(matching)
        desired = expected
    allowed = healthy - desired if expected > 0 else 0
    status: Obj = {
        "observedGeneration": pdb["metadata"].get("generation", 1),
        "disruptionsAllowed": max(0, allowed),
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
    }
    old_status = pdb.get("status") or {}
    live = {p["metadata"]["name"] for p in matching if not p["metadata"].get("deletionTimestamp")}
    disrupted = {k: v for k, v in (old_status.get("disruptedPods") or {}).items() if k in live}
    if disrupted:
        status["disruptedPods"] = disrupted
        status["disruptionsAllowed"] = max(0, status["disruptionsAllowed"] - len(disrupted))
    sufficient = status["disruptionsAllowed"] > 0
    status["conditions"] = [
        {
            "type": "DisruptionAllowed",
            "status": "True" if sufficient else "False",
            "reason": "SufficientPods" if sufficient else "InsufficientPods",
            "message": "",
            "observedGeneration": status["observedGeneration"],
            "lastTransitionTime": _keep_transition(old_status, sufficient),
        }
    ]
    return status


def _keep_transition(old_status: Mapping[str, Any], sufficient: bool) -> str:
    for cond in old_status.get("conditions") or []:
        if cond.get("type") == "DisruptionAllowed" and (cond.get("status") == "True") == sufficient:
            return str(cond.get("lastTransitionTime"))
    return now_rfc3339()


def _preconditions_hold(obj: Obj, preconditions: Mapping[str, Any] | None) -> bool:
    meta = obj["metadata"]
    wanted = preconditions or {}
    uid, version = wanted.get("uid"), wanted.get("resourceVersion")
    return (not uid or uid == meta["uid"]) and (not version or version == meta["resourceVersion"])

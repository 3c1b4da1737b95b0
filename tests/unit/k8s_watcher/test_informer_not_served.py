"""What an informer does when the API server does not serve its kind (a CRD not installed):
an optional kind with nothing mirrored is synced empty; with objects mirrored, a 404 is no
proof they are gone, so they are kept and the informer is not synced (fail closed)."""

from __future__ import annotations

from typing import Any, cast

from k8s_watcher.informer import Informer, KindNotServed
from k8s_watcher.kinds import watched_kind_infos
from k8s_watcher.sync import Stamp
from nodeflow_bus import Backoff
from nodeflow_contracts.topology import WATCHED_KINDS


def informer(kind: str, index: dict[str, Stamp]) -> Informer:
    (info,) = [k for k in watched_kind_infos() if k.kind == kind]
    return Informer(
        kube=cast(Any, None),
        bus=cast(Any, None),
        kind=info,
        namespace=None,
        label_selector="",
        index=index,
        backoff=Backoff(initial=0.001, maximum=0.001),
        not_served_recheck=0.0,
    )


async def test_rule_an_optional_kind_not_served_and_never_mirrored_is_synced_empty() -> None:
    watching = informer("NodeWright", {})
    await watching._wait_until_served(KindNotServed("no CRD"), 1)
    assert watching.synced.is_set() and watching.not_served == "no CRD"


async def test_rule_a_kind_not_served_with_objects_mirrored_keeps_them_and_is_not_synced() -> None:
    index = {"_.tuning": Stamp("u1", "7")}
    watching = informer("NodeWright", index)
    await watching._wait_until_served(KindNotServed("no CRD"), 1)
    assert not watching.synced.is_set() and watching.not_served == ""
    assert index == {"_.tuning": Stamp("u1", "7")}


def test_rule_only_other_projects_custom_resources_are_optional() -> None:
    optional = {k.kind for k in WATCHED_KINDS if k.optional}
    assert {"NodeMaintenance", "Skyhook", "NodeWright", "PodGroup"} <= optional
    assert not optional & {"Pod", "Node", "Job", "NodeSet", "NodeSlice", "StorageClass"}
    # An alpha Kubernetes API is optional too, and no CRD serves it.
    (workload,) = (k for k in WATCHED_KINDS if k.group == "scheduling.k8s.io")
    assert workload.optional and not workload.served_by_crd and workload.read_only

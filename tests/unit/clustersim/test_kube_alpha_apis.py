"""Alpha built-in APIs in the emulator: off by default, as on a real cluster, and served when
enabled as kube-apiserver's `--runtime-config` enables them (the Workload API's PodGroup,
scheduling.k8s.io/v1alpha2, beside scheduler-plugins' PodGroup CRD)."""

from __future__ import annotations

import pytest

from clustersim.kube.errors import NotFound
from clustersim.kube.resources import alpha_resource_infos
from clustersim.kube.server import api_groups
from clustersim.kube.store import Store

WORKLOAD_POD_GROUP = {
    "apiVersion": "scheduling.k8s.io/v1alpha2",
    "kind": "PodGroup",
    "metadata": {"name": "train", "namespace": "default"},
    "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}, "disruptionMode": "PodGroup"},
}


def scheduling_versions(store: Store) -> tuple[list[str], str]:
    (group,) = (g for g in api_groups(store) if g["name"] == "scheduling.k8s.io")
    return [v["version"] for v in group["versions"]], group["preferredVersion"]["version"]


def test_rule_an_alpha_api_is_not_served_by_default() -> None:
    store = Store()
    with pytest.raises(NotFound):
        store.create("podgroups.scheduling.k8s.io", dict(WORKLOAD_POD_GROUP))
    assert scheduling_versions(store) == (["v1"], "v1")


def test_rule_an_alpha_api_enabled_by_runtime_config_is_served_beside_the_ga_one() -> None:
    store = Store()
    for info in alpha_resource_infos(["scheduling.k8s.io/v1alpha2=true"]):
        store.register(info)
    created = store.create("podgroups.scheduling.k8s.io", dict(WORKLOAD_POD_GROUP))
    assert created["spec"]["disruptionMode"] == "PodGroup"
    # PriorityClasses stay the preferred version's.
    assert scheduling_versions(store) == (["v1", "v1alpha2"], "v1")
    assert alpha_resource_infos(["scheduling.k8s.io/v1alpha2=false"]) == []


def test_rule_an_unknown_runtime_config_entry_is_refused() -> None:
    with pytest.raises(ValueError, match="no such alpha API"):
        alpha_resource_infos(["batch/v2alpha1=true"])
    with pytest.raises(ValueError, match="true or false"):
        alpha_resource_infos(["scheduling.k8s.io/v1alpha2=maybe"])

"""A cluster without another project's CRD (an operator not installed, or one of a release
before a kind existed, as Skyhook's before the NodeWright rename): k8s-watcher is ready with no
objects of that kind, and mirrors them once the CRD is installed. Our own CRDs are never
optional."""

from __future__ import annotations

import asyncio

import pytest

from clustersim.kube.resources import alpha_resource_infos
from clustersim.runner import DEFAULT_CRD_DIR, apply_crds
from k8s_watcher import informer as informer_module
from k8s_watcher.service import K8sWatcher
from nodeflow_contracts.topology import WORKLOAD_POD_GROUP_MIRROR
from tests.integration.k8s_watcher.conftest import Harness

CRDS = "customresourcedefinitions.apiextensions.k8s.io"
NODEWRIGHTS = "nodewrights.nodewright.nvidia.com"


async def test_rule_a_kind_whose_crd_is_not_installed_is_ready_empty_then_mirrored_once_installed(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(informer_module, "NOT_SERVED_RECHECK_SECONDS", 0.2)
    harness.store.delete(CRDS, NODEWRIGHTS)
    watcher = await harness.start_watcher()
    (nodewrights,) = [i for i in watcher.informers if i.kind.kind == "NodeWright"]
    assert watcher.not_ready_reason() is None
    assert f"CustomResourceDefinition {NODEWRIGHTS} is not installed" in nodewrights.not_served
    assert await harness.kv_keys("NodeWright") == set()

    apply_crds(harness.store, DEFAULT_CRD_DIR)
    harness.store.create(
        NODEWRIGHTS,
        {
            "apiVersion": "nodewright.nvidia.com/v1alpha1",
            "kind": "NodeWright",
            "metadata": {"name": "tuning"},
            "spec": {"nodeSelectors": {"matchLabels": {"gpu": "true"}}, "packages": {}},
        },
    )

    deadline = asyncio.get_running_loop().time() + 10.0
    while "_.tuning" not in await harness.kv_keys("NodeWright"):  # cluster-scoped: "_.<name>"
        assert asyncio.get_running_loop().time() < deadline, "NodeWright never mirrored"
        await asyncio.sleep(0.1)
    assert nodewrights.not_served == ""


async def test_rule_our_own_crd_missing_keeps_k8s_watcher_not_ready(harness: Harness) -> None:
    harness.store.delete(CRDS, "nodeslices.nodeflow.dev")
    watcher = await K8sWatcher.connect(harness.config(), await harness.connect_as("k8s-watcher"))
    await watcher.start()
    harness.watcher = watcher  # stopped by the fixture
    await asyncio.sleep(1.0)
    reason = watcher.not_ready_reason() or ""
    assert "initial list not done" in reason and "NodeSlice/*" in reason


async def test_rule_an_alpha_api_not_enabled_is_ready_empty_then_mirrored_once_served(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Workload API's PodGroup (scheduling.k8s.io/v1alpha2) is served only where the
    cluster enables it: k8s-watcher is ready without it, says why, and mirrors its objects
    (into their own bucket, beside scheduler-plugins' PodGroups) once it is served."""
    monkeypatch.setattr(informer_module, "NOT_SERVED_RECHECK_SECONDS", 0.2)
    watcher = await harness.start_watcher()
    (workload_groups,) = [
        i for i in watcher.informers if i.kind.mirror_as == WORKLOAD_POD_GROUP_MIRROR
    ]
    assert watcher.not_ready_reason() is None
    assert "an alpha API the cluster does not enable" in workload_groups.not_served
    assert "--runtime-config=scheduling.k8s.io/v1alpha2=true" in workload_groups.not_served

    for info in alpha_resource_infos(["scheduling.k8s.io/v1alpha2=true"]):
        harness.store.register(info)
    harness.store.create(
        "podgroups.scheduling.k8s.io",
        {
            "apiVersion": "scheduling.k8s.io/v1alpha2",
            "kind": "PodGroup",
            "metadata": {"name": "train", "namespace": "default"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}, "disruptionMode": "PodGroup"},
        },
    )
    deadline = asyncio.get_running_loop().time() + 10.0
    while "default.train" not in await harness.kv_keys(WORKLOAD_POD_GROUP_MIRROR):
        assert asyncio.get_running_loop().time() < deadline, "PodGroup never mirrored"
        await asyncio.sleep(0.1)
    assert workload_groups.not_served == ""
    # Not in scheduler-plugins' bucket: another kind of the same name.
    assert "default.train" not in await harness.kv_keys("PodGroup")

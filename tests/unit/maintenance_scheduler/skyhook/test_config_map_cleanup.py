"""The controller deletes the ConfigMaps it no longer wants (upstream UpsertConfigmaps,
ValidateNodeConfigmaps; our skyhook/configmaps.py). docs/maintenance-scheduler.md points here."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maintenance_scheduler.skyhook.api import Skyhook, parse_skyhook
from maintenance_scheduler.skyhook.commands import command_for
from maintenance_scheduler.skyhook.configmaps import (
    ConfigMapFacts,
    DeleteConfigMap,
    package_config_map_deletes,
)
from maintenance_scheduler.skyhook.jobs import DEFAULT_POD_OPTIONS, job_name
from maintenance_scheduler.skyhook.plan import NodeView, World, plan_round
from maintenance_scheduler.skyhook.pod import node_metadata_config_map, package_config_map
from maintenance_scheduler.skyhook.stages import JobFacts, PackageState, render_node_state
from nodeflow_contracts.skyhook import FLAVORS, NODEWRIGHT, SKYHOOK, SkyhookNames
from tests.unit.maintenance_scheduler.skyhook.test_skyhook_plan import T0

BOTH = pytest.mark.parametrize("names", FLAVORS, ids=[n.kind for n in FLAVORS])


def flavored(
    names: SkyhookNames,
    version: str = "2.0.0",
    *,
    name: str = "gpu-init",
    selector: dict[str, Any] | None = None,
) -> Skyhook:
    spec: dict[str, Any] = {
        "packages": {
            "driver": {
                "version": version,
                "image": "ghcr.io/x/driver",
                "configMap": {"driver.conf": "mode=fast"},
            }
        }
    }
    if selector is not None:
        spec["nodeSelectors"] = selector
    return parse_skyhook(
        {
            "apiVersion": names.api_version,
            "kind": names.kind,
            "metadata": {"name": name, "uid": f"uid-{name}", "finalizers": [names.finalizer]},
            "spec": spec,
        }
    )


def facts(body: dict[str, Any]) -> ConfigMapFacts:
    metadata = body["metadata"]
    return ConfigMapFacts(
        name=metadata["name"],
        uid=f"cm-uid-{metadata['name']}",
        labels=metadata["labels"],
        annotations=metadata["annotations"],
    )


def package_cm(skyhook: Skyhook, version: str) -> ConfigMapFacts:
    """The configMap the object wrote when its package was at `version`."""
    old = flavored(skyhook.names, version, name=skyhook.name)
    return facts(package_config_map(old, old.packages[0], namespace="skyhook"))


def metadata_cm(skyhook: Skyhook, node: str) -> ConfigMapFacts:
    return facts(
        node_metadata_config_map(DEFAULT_POD_OPTIONS, skyhook, node, {}, {}, namespace="skyhook")
    )


def node(
    name: str, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> NodeView:
    return NodeView(
        name, f"uid-{name}", "1", dict(labels or {}), dict(annotations or {}), created=T0
    )


def entry(stage: str, version: str = "1.0.0", state: str = "in_progress") -> PackageState:
    return PackageState(
        name="driver", version=version, image="ghcr.io/x/driver", stage=stage, state=state
    )


def state_of(skyhook: Skyhook, *entries: PackageState) -> dict[str, str]:
    return {
        skyhook.names.node_state_annotation(skyhook.name): render_node_state(
            {e.key: e for e in entries}
        )
    }


def deletes(
    skyhooks: list[Skyhook],
    nodes: list[NodeView],
    config_maps: list[ConfigMapFacts],
    **world: Any,
) -> list[DeleteConfigMap]:
    plan = plan_round(
        World(
            skyhooks=skyhooks,
            policies={},
            nodes=nodes,
            jobs=world.pop("jobs", {}),
            maintenances={},
            config_maps={cm.name: cm for cm in config_maps},
            **world,
        ),
        now=T0,
    )
    return [a for a in plan.actions if isinstance(a, DeleteConfigMap)]


@BOTH
def test_rule_a_package_config_map_no_package_names_any_more_is_deleted(
    names: SkyhookNames,
) -> None:
    skyhook = flavored(names, "2.0.0")
    old, current = package_cm(skyhook, "1.0.0"), package_cm(skyhook, "2.0.0")
    assert old.name == "gpu-init-driver-1.0.0"
    found = deletes([skyhook], [node("n1")], [old, current])
    assert found == [DeleteConfigMap("gpu-init", old.name, old.uid, "package", names)]


@BOTH
def test_rule_an_uninstall_in_progress_keeps_its_package_config_map(names: SkyhookNames) -> None:
    skyhook = flavored(names, "2.0.0")
    old = package_cm(skyhook, "1.0.0")
    for stage in ("uninstall", "uninstall-interrupt"):
        uninstalling = node("n2", annotations=state_of(skyhook, entry(stage)))
        assert deletes([skyhook], [node("n1"), uninstalling], [old]) == []
    # Once the cycle is over (the entry at the new version, applied), it goes.
    done = node("n2", annotations=state_of(skyhook, entry("apply", "2.0.0", "complete")))
    assert [d.name for d in deletes([skyhook], [done], [old])] == [old.name]


def test_rule_an_unreadable_or_unsettled_node_state_deletes_no_package_config_map() -> None:
    skyhook = flavored(SKYHOOK, "2.0.0")
    old = package_cm(skyhook, "1.0.0")
    annotation = SKYHOOK.node_state_annotation(skyhook.name)
    unreadable = node("n2", annotations={annotation: "{not json"})
    assert deletes([skyhook], [node("n1"), unreadable], [old]) == []
    # A node whose state patch may still land (it may start an uninstall): nothing either.
    settling = node("n2", annotations=state_of(skyhook, entry("apply", "2.0.0", "complete")))
    assert deletes([skyhook], [settling], [old], settling=frozenset({"n2"})) == []
    assert [d.name for d in deletes([skyhook], [settling], [old])] == [old.name]


@BOTH
def test_rule_a_node_no_longer_targeted_loses_its_metadata_config_map(names: SkyhookNames) -> None:
    skyhook = flavored(names, selector={"matchLabels": {"gpu": "true"}})
    kept, left = metadata_cm(skyhook, "n1"), metadata_cm(skyhook, "n2")
    nodes = [node("n1", {"gpu": "true"}), node("n2")]
    found = deletes([skyhook], nodes, [kept, left])
    assert found == [DeleteConfigMap("gpu-init", left.name, left.uid, "node-metadata", names)]
    # A node that left the cluster loses it too.
    assert [d.name for d in deletes([skyhook], nodes[:1], [kept, left])] == [left.name]


def test_rule_a_job_still_running_on_an_untargeted_node_keeps_its_metadata() -> None:
    skyhook = flavored(SKYHOOK, selector={"matchLabels": {"gpu": "true"}})
    left = metadata_cm(skyhook, "n2")
    name = job_name(skyhook.name, "driver", "2.0.0", "apply", "n2", "")
    running = JobFacts(
        name=name, outcome="running", slot=(skyhook.owner_key, "driver", "n2"), stage="apply"
    )
    assert deletes([skyhook], [node("n2")], [left], jobs={name: running}) == []


def test_rule_config_map_deletes_touch_only_the_objects_own() -> None:
    skyhook = flavored(SKYHOOK, "2.0.0")
    # A NodeWright of the same name, another Skyhook: their ConfigMaps are theirs.
    theirs = [
        package_cm(flavored(NODEWRIGHT, name="gpu-init"), "1.0.0"),
        package_cm(flavored(SKYHOOK, name="other"), "1.0.0"),
        metadata_cm(flavored(SKYHOOK, name="other"), "gone"),
    ]
    assert deletes([skyhook], [node("n1")], theirs) == []
    # A Skyhook being deleted leaves its ConfigMaps to the garbage collector.
    deleted = parse_skyhook(
        {
            "metadata": {
                "name": "gpu-init",
                "uid": "uid-gpu-init",
                "finalizers": [SKYHOOK.finalizer],
                "deletionTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {"packages": {}},
        }
    )
    assert deletes([deleted], [node("n1")], [package_cm(skyhook, "1.0.0")]) == []


def test_rule_package_and_metadata_config_maps_carry_upstreams_labels_and_owner() -> None:
    skyhook = flavored(SKYHOOK)
    package = package_config_map(skyhook, skyhook.packages[0], namespace="skyhook")
    metadata = node_metadata_config_map(DEFAULT_POD_OPTIONS, skyhook, "n1", {}, {}, namespace="s")
    for body in (package, metadata):
        labels = body["metadata"]["labels"]
        assert labels["skyhook.nvidia.com/name"] == "gpu-init"
        assert labels["app.kubernetes.io/managed-by"] == "nodeflow-skyhook"
        # Gone with its Skyhook (the garbage collector follows the controller reference).
        (owner,) = body["metadata"]["ownerReferences"]
        assert owner["uid"] == skyhook.uid and owner["controller"] is True
    assert metadata["metadata"]["labels"]["skyhook.nvidia.com/skyhook-node-meta"] == "gpu-init"
    assert "skyhook.nvidia.com/skyhook-node-meta" not in package["metadata"]["labels"]


def test_rule_a_config_map_delete_is_a_uid_preconditioned_delete_command() -> None:
    action = DeleteConfigMap("gpu-init", "gpu-init-driver-1.0.0", "cm-uid", "package", NODEWRIGHT)
    command = command_for(
        action, T0, namespace="skyhook", default_stage_timeout_seconds=60, drain_timeout_seconds=60
    )
    assert command.op == "delete"
    assert (command.target.kind, command.target.name) == ("ConfigMap", "gpu-init-driver-1.0.0")
    assert (command.target.namespace, command.target.uid) == ("skyhook", "cm-uid")


STAGES = st.sampled_from(
    [
        "apply",
        "config",
        "interrupt",
        "post-interrupt",
        "upgrade",
        "uninstall",
        "uninstall-interrupt",
    ]
)


@settings(max_examples=150, deadline=None)
@given(
    spec_version=st.sampled_from(["1.0.0", "2.0.0", "3.0.0"]),
    versions=st.sets(st.sampled_from(["1.0.0", "2.0.0", "3.0.0", "4.0.0"]), max_size=4),
    node_entries=st.lists(
        st.one_of(st.none(), st.tuples(STAGES, st.sampled_from(["1.0.0", "2.0.0"]))),
        max_size=4,
    ),
    unreadable=st.booleans(),
    settled=st.booleans(),
)
def test_property_a_package_config_map_that_may_be_mounted_is_never_deleted(
    spec_version: str,
    versions: set[str],
    node_entries: list[tuple[str, str] | None],
    unreadable: bool,
    settled: bool,
) -> None:
    skyhook = flavored(SKYHOOK, spec_version)
    config_maps = [package_cm(skyhook, v) for v in sorted(versions)]
    states: list[str | None] = [
        None if e is None else render_node_state({"driver": entry(e[0], e[1])})
        for e in node_entries
    ]
    if unreadable:
        states.append("[")
    found = package_config_map_deletes(
        skyhook, config_maps, node_states=states, states_settled=settled
    )
    deleted = {d.name for d in found}
    assert f"gpu-init-driver-{spec_version}" not in deleted
    if unreadable or not settled:
        assert not deleted
    if any(e is not None and e[0] in ("uninstall", "uninstall-interrupt") for e in node_entries):
        assert not deleted
    # Everything else not wanted goes.
    if (
        settled
        and not unreadable
        and not any(
            e is not None and e[0] in ("uninstall", "uninstall-interrupt") for e in node_entries
        )
    ):
        assert deleted == {cm.name for cm in config_maps} - {f"gpu-init-driver-{spec_version}"}

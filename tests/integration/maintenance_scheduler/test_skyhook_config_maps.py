"""The Skyhook controller deletes the ConfigMaps it no longer wants (skyhook/configmaps.py),
on the whole local stack: k8s-watcher mirrors only the controller's own ConfigMaps (its label
selector on list and watch), and deletes them on the controller's commands."""

from __future__ import annotations

from typing import Any

from maintenance_scheduler.skyhook.api import NODE_STATE_VERSION, parse_skyhook
from maintenance_scheduler.skyhook.pod import node_metadata_name, package_config_map
from maintenance_scheduler.skyhook.stages import PackageState, render_node_state
from nodeflow_contracts.skyhook import NODEWRIGHT
from tests.integration.maintenance_scheduler.conftest import NS, eventually
from tests.integration.maintenance_scheduler.test_skyhook import (
    SKYHOOKS,
    SkyhookStack,
    rounds_pass,
)
from tests.integration.maintenance_scheduler.test_skyhook import (
    sky as sky,  # the fixture
)

MERGE = "application/merge-patch+json"
NODEWRIGHTS = f"{NODEWRIGHT.plural}.{NODEWRIGHT.group}"


def config_maps(sky: SkyhookStack) -> set[str]:
    return {cm["metadata"]["name"] for cm in sky.stack.sim.store.list("configmaps", NS).items}


def mirrored(sky: SkyhookStack) -> set[str]:
    controller = sky.controller
    assert controller is not None
    return {str(obj["metadata"]["name"]) for obj in controller.config_maps.as_dict().values()}


def patch_skyhook(
    sky: SkyhookStack, name: str, spec: dict[str, Any], resource: str = SKYHOOKS
) -> None:
    sky.stack.sim.store.patch(resource, name, {"spec": spec}, MERGE)


def nodewright_status(sky: SkyhookStack, name: str) -> str:
    return str((sky.stack.sim.store.get(NODEWRIGHTS, name).get("status") or {}).get("status"))


def label_node(sky: SkyhookStack, node: str, value: str | None) -> None:
    sky.stack.sim.store.patch("nodes", node, {"metadata": {"labels": {"cm-gc": value}}}, MERGE)


async def test_rule_the_controller_deletes_its_config_maps_no_longer_wanted(
    sky: SkyhookStack,
) -> None:
    """A version change deletes the old version's configMap once the new one is complete; a
    node leaving the selector loses its metadata ConfigMap; k8s-watcher mirrors the
    controller's ConfigMaps and no other."""
    stack = sky.stack
    first, second = stack.node_names()[:2]
    for node in (first, second):
        label_node(sky, node, "yes")
    stack.sim.store.create(
        "configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "theirs", "namespace": NS}},
    )
    await sky.start()
    packages = {
        "driver": {"version": "1.0.0", "image": "registry.local/driver", "configMap": {"a": "1"}}
    }
    sky.skyhook("gc", packages, nodeSelectors={"matchLabels": {"cm-gc": "yes"}})
    await eventually(lambda: sky.status("gc") == "complete", timeout=60, what="complete")
    metadata = {node: node_metadata_name("gc", node) for node in (first, second)}
    ours = {"gc-driver-1.0.0", *metadata.values()}
    assert ours <= config_maps(sky)
    await eventually(lambda: mirrored(sky) == ours, timeout=30, what="ours mirrored")
    assert "theirs" in config_maps(sky)  # not mirrored (and never deleted)

    patch_skyhook(sky, "gc", {"packages": {"driver": {"version": "1.1.0"}}})
    await eventually(
        lambda: "gc-driver-1.0.0" not in config_maps(sky), timeout=60, what="old version gone"
    )
    assert "gc-driver-1.1.0" in config_maps(sky)
    await eventually(lambda: sky.status("gc") == "complete", timeout=60, what="upgraded")

    label_node(sky, second, None)
    await eventually(
        lambda: metadata[second] not in config_maps(sky), timeout=60, what="metadata gone"
    )
    assert metadata[first] in config_maps(sky)
    assert "theirs" in config_maps(sky)
    await eventually(
        lambda: mirrored(sky) == {"gc-driver-1.1.0", metadata[first]},
        timeout=30,
        what="mirror follows",
    )

    # Deleted with its Skyhook: the garbage collector follows their controller reference.
    stack.sim.store.delete(SKYHOOKS, "gc")
    await eventually(
        lambda: config_maps(sky) & {"gc-driver-1.1.0", metadata[first]} == set(),
        timeout=60,
        what="collected with the Skyhook",
    )


async def test_rule_an_uninstall_in_progress_keeps_its_config_map(sky: SkyhookStack) -> None:
    """A NodeWright's explicit uninstall of driver 1.0.0-sleep (whose uninstall never ends in
    the simulator) is under way on a node, left by an earlier controller, while the spec says
    2.0.0: 1.0.0-sleep's configMap is no longer the spec's but stays while the uninstall is
    in progress; once the node's entry is gone (uninstalled), the configMap goes."""
    stack = sky.stack
    node = stack.node_names()[0]
    old = {"version": "1.0.0-sleep", "image": "registry.local/driver", "configMap": {"a": "1"}}
    body = {
        "apiVersion": NODEWRIGHT.api_version,
        "kind": NODEWRIGHT.kind,
        "metadata": {"name": "keeper"},
        "spec": {
            "packages": {
                "driver": {
                    "version": "2.0.0",
                    "image": "registry.local/driver",
                    "configMap": {"a": "2"},
                    "uninstall": {"enabled": True, "apply": True},
                }
            },
            "nodeSelectors": {"matchLabels": {"kubernetes.io/hostname": node}},
        },
    }
    created = stack.sim.store.create(NODEWRIGHTS, body)
    earlier = parse_skyhook({**created, "spec": {"packages": {"driver": old}}})
    stack.sim.store.create(
        "configmaps", package_config_map(earlier, earlier.packages[0], namespace=NS)
    )
    entry = PackageState(
        name="driver",
        version="1.0.0-sleep",
        image="registry.local/driver",
        stage="uninstall",
        state="in_progress",
        uninstall_enabled=True,
    )
    state_key = NODEWRIGHT.node_state_annotation("keeper")
    annotations = {
        state_key: render_node_state({entry.key: entry}),
        NODEWRIGHT.version_annotation("keeper"): NODE_STATE_VERSION,
    }
    stack.sim.store.patch("nodes", node, {"metadata": {"annotations": annotations}}, MERGE)
    await sky.start()

    def stage() -> str:
        return str(stack.node(node)["metadata"]["annotations"].get(state_key) or "")

    await eventually(
        lambda: any(
            j["metadata"]["labels"].get(NODEWRIGHT.stage_label) == "uninstall"
            for j in stack.sim.store.list("jobs.batch", NS).items
        ),
        timeout=60,
        what="the uninstall Job runs",
    )
    await rounds_pass(sky, 5)
    assert '"stage":"uninstall"' in stage()
    assert "keeper-driver-1.0.0-sleep" in config_maps(sky)  # kept: its uninstall is under way
    assert "keeper-driver-1.0.0-sleep" in mirrored(sky)
    # The uninstall over (its entry gone from the node), the configMap goes.
    stack.sim.store.patch("nodes", node, {"metadata": {"annotations": {state_key: "{}"}}}, MERGE)
    await eventually(
        lambda: "keeper-driver-1.0.0-sleep" not in config_maps(sky),
        timeout=60,
        what="gone once uninstalled",
    )
